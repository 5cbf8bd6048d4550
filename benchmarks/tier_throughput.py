"""Throughput of the tiering copy: MB/s per executor core, from testbed Kafka to remote storage.

Starts a real broker (and moto's S3 server) on loopback, produces `--mb` MB of 1 KiB
records into `--partitions` partitions (librdkafka, uncompressed, 1 MiB batches), then
measures, for each backend (local files, S3):

- `task`: the copy task itself (`pipeline.copy.run_copy`), partitions one after the other
  in this process: one core's worth of fetch -> .log -> indexes -> upload -> metadata.
  Also as MB per CPU-second of this process (all its threads), which a machine shared with
  other work (the broker runs here too) disturbs less than wall time;
- `spark`: the copy job of a `tierproxy tier` pass on Spark local[N] with warm Python
  workers (job scheduling, task serialization, accumulators included; planning and commit
  not), reported as MB/s and MB/s per core (N cores).

    .venv/bin/python benchmarks/tier_throughput.py --mb 300 --partitions 2

The target is >= 100 MB/s per core to local files. With `--copy-quota MB` the pipeline's
copy quota (`remote.log.manager.copy.max.bytes.per.second`, KIP-956, for all tasks
together) is set, and the `spark` rows also give their rate as a fraction of the quota
(the `task` rows call the copy task without it: the quota is a pass's).
Everything it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # testbed/ is not installed

from benchmark_data import MB, produce  # noqa: E402 - beside this script



def config_for(tmp: Path, bootstrap: str, topic: str, backend: str, s3=None, copy_quota_mb: float | None = None):
    from tierproxy.config import parse

    properties = {
        "bootstrap.servers": bootstrap,
        "remote.log.metadata.backend": "file",
        "remote.log.metadata.dir": str(tmp / f"metadata-{backend}"),
        f"topic.{topic}.remote.storage.enable": "true",
        f"topic.{topic}.segment.bytes": str(64 * 1024 * 1024),
        f"topic.{topic}.segment.ms": "1",  # ship the tail too: measure every byte
    }
    if backend == "local":
        properties |= {"remote.log.storage.backend": "local", "remote.log.storage.local.dir": str(tmp / "remote")}
    else:
        properties |= s3.storage_properties(f"bench-{int(time.time())}")
    if copy_quota_mb is not None:
        properties["remote.log.manager.copy.max.bytes.per.second"] = str(int(copy_quota_mb * MB))
    return parse(properties)


async def measure_task(config, repeats: int) -> tuple[int, float, float]:
    """Bytes copied, wall seconds and CPU seconds (this process, all threads) of the copy task
    over every partition in turn; the best of `repeats` runs (each copies everything again;
    the losers are cleaned as orphans by the commit)."""
    from tierproxy.client.cluster import Cluster
    from tierproxy.pipeline.commit import commit_partition
    from tierproxy.pipeline.copy import metadata_manager, run_copy
    from tierproxy.pipeline.plan import plan_pass
    from tierproxy.storage.factory import remote_storage_manager

    async with Cluster.from_config(config) as cluster, metadata_manager(config) as rlmm:
        plans = [p for p in await plan_pass(config, cluster, rlmm) if not p.empty]
    best = None
    for _ in range(repeats):
        copied, wall, cpu, results = 0, 0.0, 0.0, []
        for plan in plans:
            started, started_cpu = time.perf_counter(), time.process_time()
            result = await run_copy(config, plan)
            wall += time.perf_counter() - started
            cpu += time.process_time() - started_cpu
            copied += result.bytes_copied
            results.append((plan, result))
        if best is None or wall < best[1]:
            best = (copied, wall, cpu, results)
    copied, wall, cpu, results = best
    # Commit the best run's segments, so the metadata stays consistent (not timed).
    async with remote_storage_manager(config) as rsm, metadata_manager(config) as rlmm:
        for plan, result in results:
            await commit_partition(rlmm, rsm, plan, result.metadata())
    return copied, wall, cpu


def measure_spark(config, cores: int) -> tuple[int, float]:
    from tierproxy.pipeline.spark import spark_session
    from tierproxy.pipeline.tier import run_pass

    spark = spark_session(config.with_overrides({"spark.master": f"local[{cores}]"}),
                          {"spark.ui.enabled": "false"})
    try:
        # Warm the Python workers (started once and reused, as in a `tier --every` loop):
        # what is measured is the copy, not interpreter start-up and imports.
        started = time.perf_counter()
        sc = spark.sparkContext
        sc.parallelize(range(cores), cores).map(lambda _: __import__("tierproxy.pipeline.copy") and 0).collect()
        print(f"      (Spark workers started and warmed in {time.perf_counter() - started:.1f}s, not counted)")
        report = run_pass(config, spark, retention=False, summary=False, stream=open(os.devnull, "w"))
    finally:
        spark.stop()
    if not report.ok:
        raise RuntimeError(f"pass failed: {report.errors}")
    return report.bytes, report.copy_seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=300, help="MB to produce and copy (default 300)")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--cores", type=int, default=2, help="Spark local[N] for the spark measurement")
    parser.add_argument("--backends", default="local,s3")
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--repeats", type=int, default=2, help="task runs per backend; the best counts")
    parser.add_argument("--copy-quota", type=float, metavar="MB", help="the copy quota in MB/s (default: none)")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from testbed.kafka import KafkaCluster
    from testbed.s3 import S3Server

    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    print(f"machine: {platform.node()} {platform.machine()}, nproc {os.cpu_count()}, "
          f"python {platform.python_version()}, date {datetime.datetime.now().isoformat(timespec='seconds')}")
    backends = args.backends.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tier-bench-") as tmp_name, \
            KafkaCluster(1, broker_config={"log.segment.bytes": 256 * 1024 * 1024}) as kafka, \
            (S3Server() if "s3" in backends else _Nothing()) as s3:
        tmp = Path(tmp_name)
        # One topic per measurement: each copies the whole data set from offset 0.
        for backend in backends:
            for mode in ("task",) if args.skip_spark else ("task", "spark"):
                topic = f"bench-{backend}-{mode}"
                kafka.create_topic(topic, partitions=args.partitions)
                started = time.perf_counter()
                produce(kafka.bootstrap_servers, topic, args.partitions, args.mb)
                produce_s = time.perf_counter() - started
                config = config_for(tmp / topic, kafka.bootstrap_servers, topic, backend, s3, args.copy_quota)
                cpu = None
                if mode == "task":
                    copied, seconds, cpu = asyncio.run(measure_task(config, args.repeats))
                    cores = 1
                else:
                    copied, seconds = measure_spark(config, args.cores)
                    cores = args.cores
                rate = copied / MB / seconds
                per_cpu = copied / MB / cpu if cpu else None
                rows.append((backend, mode, cores, copied / MB, seconds, rate, rate / cores, per_cpu))
                cpu_text = f", {per_cpu:.1f} MB per CPU-second" if per_cpu else ""
                quota_text = f", {rate / args.copy_quota:.2f}x the copy quota" if args.copy_quota and mode == "spark" else ""
                print(f"{backend:5} {mode:5} cores={cores} {copied / MB:8.1f} MB in {seconds:6.2f}s "
                      f"= {rate:7.1f} MB/s, {rate / cores:7.1f} MB/s per core{cpu_text}{quota_text} "
                      f"(produced in {produce_s:.1f}s)", flush=True)
                kafka.delete_topic(topic)
    print()
    quota = f" | x the {args.copy_quota:g} MB/s copy quota" if args.copy_quota else ""
    print(f"| backend | measured | cores | MB | seconds | MB/s | MB/s per core | MB per CPU-second{quota} |")
    print("|---|---|---|---|---|---|---|---|" + ("---|" if quota else ""))
    for backend, mode, cores, mb, seconds, rate, per_core, per_cpu in rows:
        cpu_cell = f"{per_cpu:.1f}" if per_cpu else "-"
        quota_cell = "" if not args.copy_quota else f" {rate / args.copy_quota:.2f} |" if mode == "spark" else " - |"
        print(f"| {backend} | {mode} | {cores} | {mb:.1f} | {seconds:.2f} | {rate:.1f} | {per_core:.1f} | {cpu_cell} |"
              f"{quota_cell}")
    return 0


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
