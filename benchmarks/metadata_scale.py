"""Remote log metadata at scale: many partitions, many remote segments each.

For each partition count (`--partitions 1000,10000`) and backend (`--backends file,topic`):

1. Write `--segments` remote segments per partition (each a COPY_SEGMENT_STARTED record and
   its COPY_SEGMENT_FINISHED update, Kafka's serialized form) into the real store: for the
   file backend, entries in the store's own format (`encode_checked_entry`) appended to
   `remote_log_metadata.log` in bulk (an fsync per record, as a live writer does, would take
   hours for a million); for the topic backend, records produced to a metadata topic on the
   testbed broker, each to the partition Kafka's partitioner gives it.
2. In a fresh process, as `tierproxy serve` builds it: open the store read-only and wait
   until every partition is ready; report the seconds, the RSS after loading and its peak
   (VmHWM), and the mean time of one `segment_for` lookup and one `log_start_offset` at
   random offsets. The topic backend is measured twice: consuming the topic from the start,
   then restarting from the flat files it materialized.
3. One tiering pass's planning (`pipeline.plan.plan_pass`, file backend) against topics
   of that many partitions on the testbed broker (`--plan`; creating 10,000 partitions takes
   the broker a few minutes).

    .venv/bin/python benchmarks/metadata_scale.py --partitions 1000,10000 --segments 100
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PARTITIONS_PER_TOPIC = 100
SEGMENT_OFFSETS = 1000
SEGMENT_BYTES = 100 * 1024 * 1024


def segment_records(partitions: int, segments: int, topic_prefix: str):
    """(topic id partition, record) of every segment, STARTED then FINISHED, partition by partition."""
    from tierproxy.storage.model import (
        RemoteLogSegmentId,
        RemoteLogSegmentMetadata,
        RemoteLogSegmentMetadataUpdate,
        RemoteLogSegmentState,
        TopicIdPartition,
    )

    now = int(time.time() * 1000)
    for t in range(-(-partitions // PARTITIONS_PER_TOPIC)):
        topic_id = uuid.uuid4()
        for p in range(min(PARTITIONS_PER_TOPIC, partitions - t * PARTITIONS_PER_TOPIC)):
            tp = TopicIdPartition(topic_id, f"{topic_prefix}{t}", p)
            for s in range(segments):
                start = s * SEGMENT_OFFSETS
                metadata = RemoteLogSegmentMetadata(
                    RemoteLogSegmentId(tp, uuid.uuid4()), start, start + SEGMENT_OFFSETS - 1, now + s, 0, now,
                    ((0, start),), SEGMENT_BYTES)
                yield tp, metadata
                yield tp, RemoteLogSegmentMetadataUpdate(
                    metadata.segment_id, now, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 0)


def write_file_store(directory: Path, partitions: int, segments: int) -> int:
    from tierproxy.storage.metadata.file_store import LOG_FILE_NAME, encode_checked_entry
    from tierproxy.storage.metadata.serde import serialize

    directory.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(directory / LOG_FILE_NAME, "wb") as f:
        buffer = []
        for _, record in segment_records(partitions, segments, "scale-"):
            buffer.append(encode_checked_entry(serialize(record)))
            count += 1
            if len(buffer) >= 10_000:
                f.write(b"".join(buffer))
                buffer.clear()
        f.write(b"".join(buffer))
    return count


def write_topic_store(bootstrap: str, topic: str, num_partitions: int, partitions: int, segments: int) -> int:
    from confluent_kafka import Producer

    from tierproxy.storage.metadata.serde import serialize
    from tierproxy.storage.metadata.topic_store import metadata_partition

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1 << 20,
                         "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})
    count = 0
    for tp, record in segment_records(partitions, segments, "scale-"):
        while True:
            try:
                producer.produce(topic, serialize(record), partition=metadata_partition(tp, num_partitions))
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0
    return count


_CHILD = r"""
import asyncio, json, random, resource, sys, time
from pathlib import Path
from tierproxy.config import parse
from tierproxy.storage.factory import remote_log_metadata_manager

def rss_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])

async def main(properties):
    config = parse(properties)
    started = time.perf_counter()
    rlmm = remote_log_metadata_manager(config, read_only=True)
    await rlmm.start()
    partitions = rlmm.partitions()
    for tp in partitions:
        await rlmm.wait_until_ready(tp, 3600)
    loaded = time.perf_counter() - started
    rng = random.Random(1)
    picks = [(rng.choice(partitions), rng.randrange(0, %(offsets)d)) for _ in range(20000)]
    t0 = time.perf_counter()
    found = sum(rlmm.segment_for(tp, offset, 0) is not None for tp, offset in picks)
    lookup = (time.perf_counter() - t0) / len(picks)
    t0 = time.perf_counter()
    for tp, _ in picks:
        rlmm.log_start_offset(tp)
    start_lookup = (time.perf_counter() - t0) / len(picks)
    segments = sum(len(rlmm.list_segments(tp)) for tp in partitions)
    await rlmm.close()
    print(json.dumps({"seconds": loaded, "rss_mib": rss_kib("VmRSS") / 1024, "peak_mib": rss_kib("VmHWM") / 1024,
                      "partitions": len(partitions), "segments": segments, "found": found, "lookups": len(picks),
                      "segment_for_us": lookup * 1e6, "log_start_us": start_lookup * 1e6}))

asyncio.run(main(json.loads(sys.argv[1])))
"""


def measure(properties: dict[str, str], segments: int) -> dict:
    code = _CHILD % {"offsets": segments * SEGMENT_OFFSETS}
    result = subprocess.run([sys.executable, "-c", code, json.dumps(properties)], capture_output=True, text=True,
                            timeout=3600, cwd=Path(__file__).resolve().parent.parent)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def plan_time(kafka, directory: Path, partitions: int, segments: int) -> dict:
    """plan_pass over `partitions` partitions (topics of PARTITIONS_PER_TOPIC) on the broker."""
    from tierproxy.config import parse
    from tierproxy.pipeline.plan import plan_pass
    from tierproxy.storage.factory import remote_log_metadata_manager

    topics = [f"plan-{i}" for i in range(-(-partitions // PARTITIONS_PER_TOPIC))]
    started = time.perf_counter()
    for name in topics:
        kafka.create_topic(name, partitions=PARTITIONS_PER_TOPIC, config={"retention.ms": "-1"})
    created = time.perf_counter() - started
    properties = {"bootstrap.servers": kafka.bootstrap_servers, "remote.log.metadata.backend": "file",
                  "remote.log.metadata.dir": str(directory)}
    properties.update({f"topic.{name}.remote.storage.enable": "true" for name in topics})
    config = parse(properties)

    async def run() -> tuple[float, int]:
        async with remote_log_metadata_manager(config, read_only=True) as rlmm:
            t0 = time.perf_counter()
            plans = await plan_pass(config, rlmm)
            return time.perf_counter() - t0, len(plans)

    seconds, planned = asyncio.run(run())
    for name in topics:
        kafka.delete_topic(name)
    return {"plan_seconds": seconds, "planned": planned, "create_seconds": created}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="1000,10000")
    parser.add_argument("--segments", type=int, default=100, help="remote segments per partition (default 100)")
    parser.add_argument("--backends", default="file,topic")
    parser.add_argument("--plan", action="store_true", help="also time a pass's planning against the broker")
    args = parser.parse_args()
    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    print(f"machine: {platform.node()} {platform.machine()}, nproc {os.cpu_count()}, "
          f"python {platform.python_version()}, date {datetime.datetime.now().isoformat(timespec='seconds')}")
    backends = args.backends.split(",")
    rows = []
    kafka = None
    with tempfile.TemporaryDirectory(prefix="metadata-scale-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            if "topic" in backends or args.plan:
                from testbed.kafka import KafkaCluster

                kafka = KafkaCluster(1).__enter__()
            for partitions in [int(p) for p in args.partitions.split(",")]:
                if "file" in backends:
                    directory = tmp / f"file-{partitions}"
                    t0 = time.perf_counter()
                    records = write_file_store(directory, partitions, args.segments)
                    size = (directory / "remote_log_metadata.log").stat().st_size
                    print(f"file, {partitions} partitions: {records:,} records, {size / 2**20:.0f} MiB written "
                          f"in {time.perf_counter() - t0:.0f} s", flush=True)
                    row = measure({"bootstrap.servers": "", "remote.log.metadata.backend": "file",
                                   "remote.log.metadata.dir": str(directory)}, args.segments)
                    rows.append(("file", partitions, "start", row))
                    print(f"  {row}", flush=True)
                    if args.plan:
                        planned = plan_time(kafka, directory, partitions, args.segments)
                        rows.append(("file", partitions, "plan", planned))
                        print(f"  plan: {planned}", flush=True)
                if "topic" in backends:
                    from tierproxy.storage.metadata.topic_store import DEFAULT_TOPIC as topic

                    num_partitions = 50
                    kafka.create_topic(topic, partitions=num_partitions, config={"retention.ms": "-1"})
                    t0 = time.perf_counter()
                    records = write_topic_store(kafka.bootstrap_servers, topic, num_partitions, partitions,
                                                args.segments)
                    print(f"topic, {partitions} partitions: {records:,} records produced in "
                          f"{time.perf_counter() - t0:.0f} s", flush=True)
                    properties = {"bootstrap.servers": kafka.bootstrap_servers,
                                  "remote.log.metadata.backend": "topic",
                                  "remote.log.metadata.topic.num.partitions": str(num_partitions),
                                  "remote.log.metadata.dir": str(tmp / f"topic-{partitions}")}
                    for phase in ("consume", "restart"):
                        row = measure(properties, args.segments)
                        rows.append(("topic", partitions, phase, row))
                        print(f"  {phase}: {row}", flush=True)
                    kafka.delete_topic(topic)
        finally:
            if kafka is not None:
                kafka.__exit__(None, None, None)
    print()
    print(f"{args.segments} remote segments per partition; RSS of a fresh process that loaded the store")
    print()
    print("| backend | partitions | phase | segments | seconds | RSS MiB | peak MiB | segment_for us | "
          "log_start us |")
    print("|---|---|---|---|---|---|---|---|---|")
    for backend, partitions, phase, row in rows:
        if phase == "plan":
            print(f"| {backend} | {partitions:,} | plan | | {row['plan_seconds']:.2f} | | | | |")
            continue
        print(f"| {backend} | {partitions:,} | {phase} | {row['segments']:,} | {row['seconds']:.1f} | "
              f"{row['rss_mib']:.0f} | {row['peak_mib']:.0f} | {row['segment_for_us']:.1f} | "
              f"{row['log_start_us']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
