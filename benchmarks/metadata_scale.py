"""Remote log metadata at scale: many partitions, many remote segments each.

For each partition count (`--partitions 1000,10000`) and backend (`--backends file,topic,remote`):

1. Write `--segments` remote segments per partition (each a COPY_SEGMENT_STARTED record and
   its COPY_SEGMENT_FINISHED update, Kafka's serialized form) into the real store: for the
   file backend, entries in the store's own format (`encode_checked_entry`) appended to
   `remote_log_metadata.log` in bulk (an fsync per record, as a live writer does, would take
   hours for a million); for the topic backend, records produced to a metadata topic on the
   testbed broker, each to the partition Kafka's partitioner gives it.
2. In a fresh process per phase, as `tierproxy serve` (read-only) or `tierproxy tier` (a
   writer) opens the store: wait until every partition is ready; report the seconds, the RSS
   after loading and its peak (VmHWM), the records replayed, and the mean time of one
   `segment_for` (the metadata's, and the remote read side's `RemoteLogSegments.segment_for`),
   one `log_start_offset` and one `segments_from` at random offsets, and the seconds to list
   every partition's segments once (a pass's orphan cleanup and retention do). Phases:
   - file `replay`: a first start, no snapshot yet: the whole log is replayed;
   - file `writer`: the pipeline's first start after that: replays it and writes the snapshot;
   - file `restart`: one more segment per partition appended after the snapshot (a pass),
     then a start: the snapshot plus that tail;
   - topic `consume`: a first start, the whole topic read; topic `restart`: from the flat
     files it materialized;
   - remote `local` / `s3`: a first start from what the pipeline publishes into the remote
     store (`storage.metadata.bucket`: its snapshot objects, fetched concurrently), on the
     local-file store and on moto's S3 server (`--stores local,s3`).
3. One tiering pass's planning (`pipeline.plan.plan_pass`, file backend, `--plan`) against
   topics of that many partitions on the testbed broker, whose ids the metadata uses (creating
   10,000 partitions takes the broker a few minutes).

    .venv/bin/python benchmarks/metadata_scale.py --partitions 1000,10000 --segments 100 --plan
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
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


def topics_for(partitions: int) -> list[tuple[str, uuid.UUID]]:
    return [(f"scale-{t}", uuid.uuid4()) for t in range(-(-partitions // PARTITIONS_PER_TOPIC))]


def segment_records(topics: list[tuple[str, uuid.UUID]], partitions: int, segments: range):
    """(topic id partition, record) of every segment, STARTED then FINISHED, partition by partition."""
    from tierproxy.storage.model import (
        RemoteLogSegmentId,
        RemoteLogSegmentMetadata,
        RemoteLogSegmentMetadataUpdate,
        RemoteLogSegmentState,
        TopicIdPartition,
    )

    now = int(time.time() * 1000)
    for t, (name, topic_id) in enumerate(topics):
        for p in range(min(PARTITIONS_PER_TOPIC, partitions - t * PARTITIONS_PER_TOPIC)):
            tp = TopicIdPartition(topic_id, name, p)
            for s in segments:
                start = s * SEGMENT_OFFSETS
                metadata = RemoteLogSegmentMetadata(
                    RemoteLogSegmentId(tp, uuid.uuid4()), start, start + SEGMENT_OFFSETS - 1, now + s, 0, now,
                    ((0, start),), SEGMENT_BYTES)
                yield tp, metadata
                yield tp, RemoteLogSegmentMetadataUpdate(
                    metadata.segment_id, now, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 0)


def append_file_store(directory: Path, topics, partitions: int, segments: range) -> int:
    from tierproxy.storage.metadata.file_store import LOG_FILE_NAME, encode_checked_entry
    from tierproxy.storage.metadata.serde import serialize

    directory.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(directory / LOG_FILE_NAME, "ab") as f:
        buffer = []
        for _, record in segment_records(topics, partitions, segments):
            buffer.append(encode_checked_entry(serialize(record)))
            count += 1
            if len(buffer) >= 10_000:
                f.write(b"".join(buffer))
                buffer.clear()
        f.write(b"".join(buffer))
    return count


def write_topic_store(bootstrap: str, topic: str, num_partitions: int, topics, partitions: int, segments: int) -> int:
    from confluent_kafka import Producer

    from tierproxy.storage.metadata.serde import serialize
    from tierproxy.storage.metadata.topic_store import metadata_partition

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1 << 20,
                         "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})
    count = 0
    for tp, record in segment_records(topics, partitions, range(segments)):
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
import asyncio, json, random, sys, time, uuid
from pathlib import Path
from tierproxy.config import parse
from tierproxy.remote_log.segments import RemoteLogSegments
from tierproxy.storage.factory import remote_log_metadata_manager
from tierproxy.storage.model import TopicIdPartition

def rss_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])

def mean_us(picks, call):
    t0 = time.perf_counter()
    for tp, offset in picks:
        call(tp, offset)
    return (time.perf_counter() - t0) / len(picks) * 1e6

async def main(properties, writer, partitions):
    config = parse(properties)
    started = time.perf_counter()
    rlmm = remote_log_metadata_manager(config, read_only=not writer, shared=writer)
    if writer:
        rlmm.snapshot_interval_bytes = 1  # a snapshot whatever the size of this store
    await rlmm.start()
    for tp in partitions:
        await rlmm.wait_until_ready(tp, 3600)
    loaded = time.perf_counter() - started
    rss, peak = rss_kib("VmRSS") / 1024, rss_kib("VmHWM") / 1024
    replayed = getattr(rlmm, "records_replayed_at_start", None)
    if replayed is None:
        replayed = getattr(rlmm, "records_fetched", 0)  # the remote backend replays none
    rng = random.Random(1)
    picks = [(rng.choice(partitions), rng.randrange(0, %(offsets)d)) for _ in range(20000)]
    found = sum(rlmm.segment_for(tp, offset, 0) is not None for tp, offset in picks)
    segments = RemoteLogSegments(rlmm)
    t0 = time.perf_counter()
    listed = sum(len(rlmm.list_segments(tp)) for tp in partitions)  # what a pass's cleanup and retention do
    result = {
        "seconds": loaded, "rss_mib": rss, "peak_mib": peak, "replayed": replayed,
        "partitions": len(partitions), "segments": listed, "list_all_seconds": time.perf_counter() - t0,
        "found": found, "lookups": len(picks),
        "segment_for_us": mean_us(picks, lambda tp, o: rlmm.segment_for(tp, o, 0)),
        "read_side_us": mean_us(picks, segments.segment_for),
        "log_start_us": mean_us(picks, lambda tp, o: rlmm.log_start_offset(tp)),
        "segments_from_us": mean_us(picks, lambda tp, o: next(rlmm.segments_from(tp, o), None)),
    }
    await rlmm.close()
    print(json.dumps(result))

partitions = [TopicIdPartition(uuid.UUID(topic_id), name, p)
              for name, topic_id, count in json.loads(sys.argv[3]) for p in range(count)]
asyncio.run(main(json.loads(sys.argv[1]), sys.argv[2] == "writer", partitions))
"""


def measure(properties: dict[str, str], topics, partitions: int, segments: int, *, writer: bool = False) -> dict:
    """Loads the store in a fresh process and waits until each of the partitions is ready."""
    code = _CHILD % {"offsets": segments * SEGMENT_OFFSETS}
    expected = [(name, str(topic_id), min(PARTITIONS_PER_TOPIC, partitions - t * PARTITIONS_PER_TOPIC))
                for t, (name, topic_id) in enumerate(topics)]
    result = subprocess.run([sys.executable, "-c", code, json.dumps(properties), "writer" if writer else "reader",
                             json.dumps(expected)],
                            capture_output=True, text=True, timeout=7200, cwd=Path(__file__).resolve().parent.parent)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def create_topics(kafka, partitions: int) -> tuple[list[tuple[str, uuid.UUID]], float]:
    """Topics of PARTITIONS_PER_TOPIC partitions on the broker, with the ids it gave them."""
    from tierproxy.client.cluster import Cluster

    names = [name for name, _ in topics_for(partitions)]
    started = time.perf_counter()
    for name in names:
        kafka.create_topic(name, partitions=PARTITIONS_PER_TOPIC, config={"retention.ms": "-1"})

    async def ids() -> dict[str, uuid.UUID]:
        async with Cluster([kafka.bootstrap_servers]) as cluster:
            return {name: info.topic_id for name, info in (await cluster.topics(names)).items()}

    known = asyncio.run(ids())
    return [(name, known[name]) for name in names], time.perf_counter() - started


def plan_time(kafka, directory: Path, topics) -> dict:
    """plan_pass over the topics on the broker, against the file store in `directory`."""
    from tierproxy.client.cluster import Cluster
    from tierproxy.config import parse
    from tierproxy.pipeline.plan import plan_pass
    from tierproxy.storage.factory import remote_log_metadata_manager

    properties = {"bootstrap.servers": kafka.bootstrap_servers, "remote.log.metadata.backend": "file",
                  "remote.log.metadata.dir": str(directory)}
    properties.update({f"topic.{name}.remote.storage.enable": "true" for name, _ in topics})
    config = parse(properties)

    async def run() -> tuple[float, int, int]:
        async with Cluster.from_config(config) as cluster, \
                remote_log_metadata_manager(config, read_only=True) as rlmm:
            t0 = time.perf_counter()
            plans = await plan_pass(config, cluster, rlmm)
            return time.perf_counter() - t0, len(plans), sum(p.previous_segment is not None for p in plans)

    seconds, planned, continued = asyncio.run(run())
    return {"plan_seconds": seconds, "planned": planned, "with_previous_segment": continued}


def file_backend(tmp: Path, kafka, partitions: int, segments: int, plan: bool, rows: list) -> None:
    from tierproxy.storage.metadata.file_store import LOG_FILE_NAME, SNAPSHOT_FILE_NAME

    directory = tmp / f"file-{partitions}"
    topics, created = create_topics(kafka, partitions) if plan else (topics_for(partitions), 0.0)
    t0 = time.perf_counter()
    records = append_file_store(directory, topics, partitions, range(segments))
    size = (directory / LOG_FILE_NAME).stat().st_size
    print(f"file, {partitions} partitions: {records:,} records, {size / 2**20:.0f} MiB written "
          f"in {time.perf_counter() - t0:.0f} s", flush=True)
    properties = {"bootstrap.servers": "", "remote.log.metadata.backend": "file",
                  "remote.log.metadata.dir": str(directory)}
    for phase in ("replay", "writer", "restart"):
        if phase == "restart":
            tail = append_file_store(directory, topics, partitions, range(segments, segments + 1))
            print(f"  {tail:,} records appended after the snapshot "
                  f"({(directory / SNAPSHOT_FILE_NAME).stat().st_size / 2**20:.0f} MiB)", flush=True)
        row = measure(properties, topics, partitions, segments, writer=phase == "writer")
        rows.append(("file", partitions, phase, row))
        print(f"  {phase}: {row}", flush=True)
    if plan:
        planned = plan_time(kafka, directory, topics)
        planned["create_seconds"] = created
        rows.append(("file", partitions, "plan", planned))
        print(f"  plan: {planned}", flush=True)
        for name, _ in topics:
            kafka.delete_topic(name)


def topic_backend(tmp: Path, kafka, partitions: int, segments: int, rows: list) -> None:
    from tierproxy.storage.metadata.topic_store import DEFAULT_TOPIC as topic

    num_partitions = 50
    kafka.create_topic(topic, partitions=num_partitions, config={"retention.ms": "-1"})
    topics = topics_for(partitions)
    t0 = time.perf_counter()
    records = write_topic_store(kafka.bootstrap_servers, topic, num_partitions, topics, partitions, segments)
    print(f"topic, {partitions} partitions: {records:,} records produced in {time.perf_counter() - t0:.0f} s",
          flush=True)
    properties = {"bootstrap.servers": kafka.bootstrap_servers, "remote.log.metadata.backend": "topic",
                  "remote.log.metadata.topic.num.partitions": str(num_partitions),
                  "remote.log.metadata.dir": str(tmp / f"topic-{partitions}")}
    for phase in ("consume", "restart"):
        row = measure(properties, topics, partitions, segments)
        rows.append(("topic", partitions, phase, row))
        print(f"  {phase}: {row}", flush=True)
    kafka.delete_topic(topic)


def remote_backend(tmp: Path, s3, stores: list[str], partitions: int, segments: int, rows: list) -> None:
    """Publishes the segments' state as the pipeline does, then times a proxy's first start from it."""
    from tierproxy.config import parse
    from tierproxy.storage.factory import remote_storage_manager
    from tierproxy.storage.metadata.bucket import publish
    from tierproxy.storage.metadata.cache import RemoteLogMetadataCache

    topics = topics_for(partitions)
    t0 = time.perf_counter()
    cache = RemoteLogMetadataCache()
    for _, record in segment_records(topics, partitions, range(segments)):
        cache.apply(record)
    for store in stores:
        properties = {"bootstrap.servers": "", "remote.log.metadata.backend": "remote",
                      "remote.log.metadata.dir": str(tmp / "unused")}
        if store == "s3":
            properties |= s3.storage_properties(f"scale-{partitions}")
        else:
            properties |= {"remote.log.storage.backend": "local", "remote.log.storage.local.dir": str(tmp / "remote"),
                           "remote.log.storage.key.prefix": f"scale-{partitions}"}

        async def publish_all() -> None:
            async with remote_storage_manager(parse(properties)) as rsm:
                await publish(rsm, cache.partition_states())

        asyncio.run(publish_all())
        print(f"remote ({store}), {partitions} partitions: published in {time.perf_counter() - t0:.0f} s", flush=True)
        row = measure(properties, topics, partitions, segments)
        rows.append(("remote", partitions, store, row))
        print(f"  {store}: {row}", flush=True)
        t0 = time.perf_counter()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="1000,10000")
    parser.add_argument("--segments", type=int, default=100, help="remote segments per partition (default 100)")
    parser.add_argument("--backends", default="file,topic,remote")
    parser.add_argument("--stores", default="local,s3", help="remote stores of the remote backend")
    parser.add_argument("--plan", action="store_true", help="also time a pass's planning against the broker")
    args = parser.parse_args()
    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    print(f"machine: {platform.node()} {platform.machine()}, nproc {os.cpu_count()}, "
          f"python {platform.python_version()}, date {datetime.datetime.now().isoformat(timespec='seconds')}")
    backends = args.backends.split(",")
    rows: list = []
    kafka = None
    s3 = None
    with tempfile.TemporaryDirectory(prefix="metadata-scale-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            if "topic" in backends or args.plan:
                from testbed.kafka import KafkaCluster

                kafka = KafkaCluster(1).__enter__()
            stores = args.stores.split(",")
            if "remote" in backends and "s3" in stores:
                from testbed.s3 import S3Server

                s3 = S3Server().start()
            for partitions in [int(p) for p in args.partitions.split(",")]:
                if "file" in backends:
                    file_backend(tmp, kafka, partitions, args.segments, args.plan, rows)
                if "topic" in backends:
                    topic_backend(tmp, kafka, partitions, args.segments, rows)
                if "remote" in backends:
                    remote_backend(tmp, s3, stores, partitions, args.segments, rows)
        finally:
            if s3 is not None:
                s3.close()
            if kafka is not None:
                kafka.__exit__(None, None, None)
    print()
    print(f"{args.segments} remote segments per partition (+1 after the snapshot for file/restart); "
          "RSS of a fresh process that loaded the store; lookups in microseconds")
    print()
    print("| backend | partitions | phase | segments | records replayed | seconds | RSS MiB | peak MiB | "
          "segment_for | read side | log_start | segments_from | list all s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for backend, partitions, phase, row in rows:
        if phase == "plan":
            print(f"| {backend} | {partitions:,} | plan | | | {row['plan_seconds']:.2f} | | | | | | | |")
            continue
        print(f"| {backend} | {partitions:,} | {phase} | {row['segments']:,} | {row['replayed']:,} | "
              f"{row['seconds']:.1f} | {row['rss_mib']:.0f} | {row['peak_mib']:.0f} | {row['segment_for_us']:.1f} | "
              f"{row['read_side_us']:.1f} | {row['log_start_us']:.2f} | {row['segments_from_us']:.1f} | "
              f"{row['list_all_seconds']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
