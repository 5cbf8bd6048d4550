"""Iceberg backfill: a topic's history into its Iceberg table, read from the remote segments on
Spark, against a Kafka consumer reading the same history through the broker into a table of
the same schema and partition spec (the Kafka Connect sink's way).

Starts a real broker on loopback, produces `--mb` MB of 1 KiB incompressible records into
`--partitions` partitions (benchmark_data.produce), tiers them to local files with a
`tierproxy tier` pass on Spark local[2] (remote retention off: the broker keeps its local log,
so that the consumer can read it), then in each of `--repeats` rounds, interleaved:

- `tier`: the table step of a pass (`append_tables`, as `tierproxy iceberg backfill` runs it)
  on the same Spark local[2], into a new table, once per `--target-mb` value
  (`iceberg.write.target.file.size.bytes`, what bounds a task's memory);
- `consumer`: one process, librdkafka (confluent-kafka) reading every partition from offset 0
  through the broker, building the table's Arrow rows from each message and writing them with
  the pass's own Parquet writer and commit (`_FileWriter`, `commit_write`, the offsets in the
  snapshot summary as the Connect sink does) into a new table with the same schema and spec.

For each: MB of record bytes (keys and values) per CPU-second of every process it ran (tier:
this driver, Spark's JVM and its Python workers; consumer: the consumer process) and with the
broker's CPU added, MB/s per core (`tier`: 2, `consumer`: 1), the broker's CPU, and the peak
resident memory of a Spark Python worker / the consumer process. Each table's row count is
checked against the records produced. The ratios of the best and of the medians are printed.

    .venv/bin/python benchmarks/iceberg.py --mb 1000 --partitions 4 --repeats 2

Target (issue 35): `tier` >= 2x the consumer per core, 0 broker CPU, memory bounded by the
setting (a worker never holds a whole segment: `--segment-mb` is above every `--target-mb`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # testbed/ is not installed

from backfill import cpu_seconds  # noqa: E402 - beside this script
from benchmark_data import MB, RECORD_BYTES, produce  # noqa: E402 - beside this script

MIB = 1024 * 1024
SPARK_CORES = 2
SEGMENT_MS = 5000


@dataclass
class Measured:
    case: str
    round: int
    records: int
    record_bytes: int
    seconds: float
    cpu: float  # every process of the case, broker excluded
    broker_cpu: float
    peak_rss_mib: float
    cores: int

    @property
    def mb_per_cpu_s(self) -> float:
        return self.record_bytes / MB / self.cpu

    @property
    def mb_per_cpu_s_with_broker(self) -> float:
        return self.record_bytes / MB / (self.cpu + self.broker_cpu)

    @property
    def mb_per_s_per_core(self) -> float:
        return self.record_bytes / MB / self.seconds / self.cores


# ----------------------------------------------------------------------------- processes


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            pass
    return found


def _descendants(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = _children(p)
        except OSError:
            continue
        pids.extend(kids)
        todo.extend(kids)
    return pids


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _is_python(pid: int) -> bool:
    return b"python" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]


class TreeWatch:
    """CPU seconds of this process's descendants (Spark's JVM, its Python daemon and workers),
    polled so that a process that ends in between still counts up to its last poll; and the
    peak resident memory of any Python worker among them."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.cpu: dict[int, float] = {}
        self.peak_python_rss = 0.0
        self.kinds: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _poll(self) -> None:
        for pid in _descendants(os.getpid()):
            try:
                self.cpu[pid] = cpu_seconds(pid)
                if pid not in self.kinds:
                    self.kinds[pid] = "python" if _is_python(pid) else "jvm"
                if self.kinds[pid] == "python":
                    self.peak_python_rss = max(self.peak_python_rss, _rss_mib(pid))
            except OSError:
                pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll()

    def __enter__(self) -> "TreeWatch":
        self._poll()
        self.before = dict(self.cpu)
        self.peak_python_rss = 0.0
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()

    @property
    def seconds(self) -> float:
        return sum(cpu - self.before.get(pid, 0.0) for pid, cpu in self.cpu.items())

    def by_kind(self) -> dict[str, float]:
        """CPU seconds of the JVM and of the Python workers (and Spark's daemon) apart."""
        kinds: dict[str, float] = {}
        for pid, cpu in self.cpu.items():
            kind = self.kinds.get(pid, "other")
            kinds[kind] = kinds.get(kind, 0.0) + cpu - self.before.get(pid, 0.0)
        return kinds


# ----------------------------------------------------------------------------- the cases


def tier_config(tmp: Path, bootstrap: str, topic: str, segment_mb: int, segment_ms: int, **extra: str):
    from tierproxy.config import parse

    return parse({
        "bootstrap.servers": bootstrap,
        "remote.log.metadata.backend": "file",
        "remote.log.metadata.dir": str(tmp / "metadata"),
        "remote.log.storage.backend": "local",
        "remote.log.storage.local.dir": str(tmp / "remote"),
        f"topic.{topic}.remote.storage.enable": "true",
        f"topic.{topic}.segment.bytes": str(segment_mb * MIB),
        # Segments are cut at `segment_mb`, and the last one once it is `segment_ms` old: every
        # byte is history (a tiny segment.ms would cut a segment per millisecond of records).
        f"topic.{topic}.segment.ms": str(segment_ms),
        "spark.master": f"local[{SPARK_CORES}]",
        **extra,
    })


def tier_everything(config) -> int:
    """One tier pass, remote retention off; the bytes it copied."""
    from tierproxy.pipeline.spark import spark_session
    from tierproxy.pipeline.tier import run_pass

    spark = spark_session(config, {"spark.ui.enabled": "false"})
    report = run_pass(config, spark, retention=False, summary=False, stream=open(os.devnull, "w"))
    if not report.ok:
        raise RuntimeError(f"tier pass failed: {report.errors}")
    return report.bytes


def measure_tier(config, topic: str, namespace: str, target_mb: int, broker_pid: int, records: int,
                 record_bytes: int, round_: int) -> Measured:
    from tierproxy.pipeline.iceberg.append import append_tables
    from tierproxy.pipeline.spark import spark_session

    config = config.with_overrides({f"topic.{topic}.iceberg.enable": "true", "iceberg.namespace": namespace,
                                    "iceberg.write.target.file.size.bytes": str(target_mb * MIB)})
    spark = spark_session(config, {"spark.ui.enabled": "false"})
    broker = cpu_seconds(broker_pid)
    with TreeWatch() as tree:
        started, own = time.perf_counter(), time.process_time()
        reports = append_tables(config, spark, topics=[topic], stream=open(os.devnull, "w"))
        seconds, own = time.perf_counter() - started, time.process_time() - own
    broker = cpu_seconds(broker_pid) - broker
    (report,) = reports
    if report.error or report.rows != records:
        raise RuntimeError(f"table step: {report.rows} rows of {records}, error {report.error}")
    _check_rows(config, namespace, topic, records)
    kinds = tree.by_kind()
    print(f"  CPU s of the table step: driver {own:.1f}, "
          + ", ".join(f"{kind} {seconds:.1f}" for kind, seconds in sorted(kinds.items())), flush=True)
    return Measured(f"tier@{target_mb}MiB", round_, records, record_bytes, seconds, own + tree.seconds, broker,
                    tree.peak_python_rss, SPARK_CORES)


def measure_consumer(config, bootstrap: str, topic: str, partitions: int, namespace: str, target_mb: int,
                     broker_pid: int, records: int, record_bytes: int, round_: int, tmp: Path) -> Measured:
    from tierproxy.pipeline.iceberg.settings import catalog_properties

    report = tmp / f"sink-{namespace}.json"
    command = [sys.executable, __file__, "--sink", json.dumps({
        "bootstrap": bootstrap, "topic": topic, "partitions": partitions, "namespace": namespace,
        "catalog": catalog_properties(config), "target_bytes": target_mb * MIB, "report": str(report)})]
    broker = cpu_seconds(broker_pid)
    started = time.perf_counter()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    broker = cpu_seconds(broker_pid) - broker
    if process.returncode:
        raise RuntimeError(f"the consumer exited {process.returncode}")
    done = json.loads(report.read_text())
    if done["records"] != records:
        raise RuntimeError(f"the consumer wrote {done['records']} rows of {records}")
    _check_rows(config, namespace, topic, records)
    return Measured(f"consumer@{target_mb}MiB", round_, records, record_bytes, seconds,
                    usage.ru_utime + usage.ru_stime, broker, usage.ru_maxrss / 1024, 1)


def _check_rows(config, namespace: str, topic: str, records: int) -> None:
    from tierproxy.pipeline.iceberg.settings import load_catalog

    table = load_catalog(config).load_table((namespace, topic))
    total = int(table.current_snapshot().summary.additional_properties["total-records"])
    if total != records:
        raise RuntimeError(f"{namespace}.{topic} holds {total} rows, {records} were produced")


def sink(spec: dict) -> None:
    """The consumer case, in a process of its own: every partition from offset 0 to its end,
    the table's rows built message by message, written and committed as the pass does."""
    import pyarrow as pa
    from confluent_kafka import Consumer, TopicPartition
    from pyiceberg.catalog import load_catalog

    from tierproxy.pipeline.iceberg.append import _FileWriter, _target  # the pass's own writer
    from tierproxy.pipeline.iceberg.commit import begin_write, commit_write, table_offsets
    from tierproxy.pipeline.iceberg.rows import ARROW_SCHEMA
    from tierproxy.pipeline.iceberg.settings import CATALOG_NAME, TableSettings
    from tierproxy.pipeline.iceberg.table import load_or_create

    catalog = load_catalog(CATALOG_NAME, **spec["catalog"])  # a SQL catalog's tables are its name's
    table = load_or_create(catalog, TableSettings(spec["topic"], spec["namespace"], "day", -1))
    held = table_offsets(table)
    table, write_id, _ = begin_write(table)
    writer = _FileWriter(_target(table, write_id), 0, spec["target_bytes"])
    consumer = Consumer({"bootstrap.servers": spec["bootstrap"], "group.id": f"sink-{spec['namespace']}",
                         "enable.auto.commit": False, "fetch.max.bytes": 64 * MIB,
                         "max.partition.fetch.bytes": 16 * MIB, "queued.max.messages.kbytes": 256 * 1024})
    topic, partitions = spec["topic"], range(spec["partitions"])
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    next_offsets = dict.fromkeys(partitions, 0)
    records = 0
    while any(next_offsets[p] < ends[p] for p in partitions):
        messages = consumer.consume(num_messages=10_000, timeout=1.0)
        rows = [m for m in messages if m.error() is None]
        if len(rows) != len(messages):
            raise RuntimeError(next(m.error() for m in messages if m.error() is not None))
        if not rows:
            continue
        stamps = [m.timestamp() for m in rows]
        writer.add(pa.Table.from_arrays([
            pa.array([m.partition() for m in rows], pa.int32()),
            pa.array([m.offset() for m in rows], pa.int64()),
            pa.array([t for _, t in stamps], pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(
                pa.timestamp("us", tz="UTC")),
            pa.array([t - 1 for t, _ in stamps], pa.int32()),  # librdkafka: 1 CreateTime, 2 LogAppendTime
            pa.array([m.leader_epoch() for m in rows], pa.int32()),
            pa.array([m.key() for m in rows], pa.binary()),
            pa.array([m.value() for m in rows], pa.binary()),
            pa.array([[{"key": k, "value": v} for k, v in (m.headers() or ())] for m in rows],
                     ARROW_SCHEMA.field("headers").type),
        ], schema=ARROW_SCHEMA))
        for m in rows:
            next_offsets[m.partition()] = m.offset() + 1
        records += len(rows)
    consumer.close()
    writer.flush()
    commit_write(table, write_id, writer.data_files, held, "consumer", {p: (0, next_offsets[p]) for p in partitions})
    Path(spec["report"]).write_text(json.dumps({"records": records}))


# ----------------------------------------------------------------------------- the run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1000, help="MB of records to produce (default 1000)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--segment-mb", type=int, default=128, help="segment size of the tier (MiB, default 128)")
    parser.add_argument("--target-mb", default="16,64",
                        help="iceberg.write.target.file.size.bytes values of the tier case, MiB (default 16,64)")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds; best and median reported")
    parser.add_argument("--sink", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sink:
        sink(json.loads(args.sink))
        return 0
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    targets = [int(t) for t in args.target_mb.split(",")]
    if max(targets) >= args.segment_mb:
        parser.error("--segment-mb must be above every --target-mb: the point is a task never holding a segment")

    from testbed.kafka import KafkaCluster

    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    print(f"machine: {platform.node()} {platform.machine()}, nproc {os.cpu_count()}, "
          f"python {platform.python_version()}, date {datetime.datetime.now().isoformat(timespec='seconds')}, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    topic = "history"
    results: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="iceberg-bench-") as tmp_name, \
            KafkaCluster(1, broker_config={"log.segment.bytes": args.segment_mb * MIB}) as kafka:
        tmp = Path(tmp_name)
        kafka.create_topic(topic, partitions=args.partitions)
        started = time.perf_counter()
        records = produce(kafka.bootstrap_servers, topic, args.partitions, args.mb)
        record_bytes = sum(RECORD_BYTES + len(b"%d" % i) for i in range(records))
        print(f"produced {records:,} records ({record_bytes / MB:.1f} MB of keys and values) "
              f"in {time.perf_counter() - started:.1f}s", flush=True)
        time.sleep(SEGMENT_MS / 1000 + 1)  # the last segment old enough to be cut
        config = tier_config(tmp, kafka.bootstrap_servers, topic, args.segment_mb, SEGMENT_MS)
        started = time.perf_counter()
        tiered = tier_everything(config)
        segments = sum(1 for _ in (tmp / "remote").rglob("*.log"))
        print(f"tiered {tiered / MB:.1f} MB in {time.perf_counter() - started:.1f}s "
              f"({segments} segments of at most {args.segment_mb} MiB)", flush=True)
        (broker_pid,) = kafka.pids.values()
        idle = cpu_seconds(broker_pid)
        time.sleep(10)
        idle_rate = (cpu_seconds(broker_pid) - idle) / 10
        print(f"the broker idle: {idle_rate * 1000:.1f} ms of CPU per second", flush=True)
        for round_ in range(1, args.repeats + 1):
            cases = [("tier", t) for t in targets] + [("consumer", max(targets))]
            if round_ % 2 == 0:
                cases.reverse()
            for case, target in cases:
                namespace = f"r{round_}_{case}_{target}"
                if case == "tier":
                    m = measure_tier(config, topic, namespace, target, broker_pid, records, record_bytes, round_)
                else:
                    m = measure_consumer(config, kafka.bootstrap_servers, topic, args.partitions, namespace,
                                         target, broker_pid, records, record_bytes, round_, tmp)
                results.append(m)
                print(f"round {round_} {m.case:16} {m.seconds:6.1f}s  CPU {m.cpu:6.1f}s  broker CPU "
                      f"{m.broker_cpu:5.2f}s  {m.mb_per_cpu_s:6.1f} MB/CPU-s ({m.mb_per_cpu_s_with_broker:6.1f} with "
                      f"the broker)  {m.mb_per_s_per_core:6.1f} MB/s per core  peak RSS {m.peak_rss_mib:6.0f} MiB  "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    _report(results, targets, args.segment_mb, idle_rate)
    return 0


def _report(results: list[Measured], targets: list[int], segment_mb: int, idle_rate: float) -> None:
    print()
    print("| case | round | seconds | CPU s | broker CPU s | MB / CPU-s | MB / CPU-s with broker | MB/s per core "
          "| peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m in results:
        print(f"| {m.case} | {m.round} | {m.seconds:.1f} | {m.cpu:.1f} | {m.broker_cpu:.2f} | {m.mb_per_cpu_s:.1f} | "
              f"{m.mb_per_cpu_s_with_broker:.1f} | {m.mb_per_s_per_core:.1f} | {m.peak_rss_mib:.0f} |")
    print()
    consumer = [m for m in results if m.case.startswith("consumer")]
    for target in targets:
        tier = [m for m in results if m.case == f"tier@{target}MiB"]
        for name, figure in (("MB per CPU-second", "mb_per_cpu_s"), ("MB/s per core", "mb_per_s_per_core")):
            ours, theirs = [getattr(m, figure) for m in tier], [getattr(m, figure) for m in consumer]
            print(f"tier@{target}MiB / consumer, {name}: best {max(ours) / max(theirs):.2f}, "
                  f"median {statistics.median(ours) / statistics.median(theirs):.2f} (target >= 2)")
        ours_b = [m.mb_per_cpu_s for m in tier]
        theirs_b = [m.mb_per_cpu_s_with_broker for m in consumer]
        print(f"tier@{target}MiB / consumer with the broker's CPU, MB per CPU-second: best "
              f"{max(ours_b) / max(theirs_b):.2f}, median {statistics.median(ours_b) / statistics.median(theirs_b):.2f}")
        above_idle = max(m.broker_cpu - idle_rate * m.seconds for m in tier)
        print(f"tier@{target}MiB: broker CPU {max(m.broker_cpu for m in tier):.2f}s at most, {above_idle:.2f}s above "
              f"its idle rate (target 0); peak RSS of a Spark Python worker {max(m.peak_rss_mib for m in tier):.0f} "
              f"MiB with segments of {segment_mb} MiB")


if __name__ == "__main__":
    sys.exit(main())
