"""Backfill throughput: the same consumer and the same data, direct, through the proxy, and
from Kafka's own tiered storage.

One run starts a real broker (testbed, Kafka on loopback), with `e` in `--cases` a second
broker with Kafka's native tiered storage, and with `d` or `f` S3Proxy (testbed.s3proxy,
a real S3 endpoint fast enough to measure against), with `t` a second S3Proxy serving HTTPS
only. Both brokers run
with the G1 settings Kafka's documentation recommends (KAFKA_G1 below). For each partition
count (`--partitions 1,8`) the same data set (`--mb` MB of 1 KiB incompressible records,
librdkafka, uncompressed, 1 MiB batches) is produced into a topic per side:

- `<name>-local` on the broker, kept local: (a) direct from the broker; (b) through the
  proxy, tail (the data is still local);
- `<name>-remote` on the broker, tiered entirely with the pipeline's copy task and commit
  (`pipeline.copy.run_copy`, `pipeline.commit.commit_partition`, what a `tierproxy tier`
  pass runs in its Spark tasks, here without Spark) to local files and to S3, then trimmed
  to its end with DeleteRecords: (c) through the proxy, remote from local files; (x) the
  same with the segments encrypted (`remote.log.storage.encryption.*`, AES-256-GCM, tiered
  a second time into a store of their own), so that the CPU s/GB of (c) and (x) side by
  side are the cost of decryption; (d) the same as (c) from S3; (f) from S3 through testbed.latency's relay, which holds back the first byte
  of every response `--first-byte-ms` (20) as a real object store does (the relay's own CPU is
  reported beside the proxy's); (t) the same as (d) over HTTPS, as real object stores are
  reached (S3Proxy with a PKCS#12 keystore from a throwaway CA made at start, the proxy
  trusting that CA with `remote.log.storage.s3.ssl.truststore.location`; tiered a second
  time into a store of its own), so that (t) beside (d) is the cost of TLS; (w) and (W): 4 replays of (c) at once (as 4 consumer groups backfilling),
  with `proxy.workers=1` and `proxy.workers=2`;
- `<name>` on the native broker, topic `remote.storage.enable=true`,
  `local.retention.bytes=1`, tiered by Kafka itself (`LocalTieredStorage` from the
  `kafka-storage` test jar, the default `TopicBasedRemoteLogMetadataManager`): after the
  data, one more record per partition rolls the last segment, and the run waits until that
  record's segment is the only one left in the broker's log directory: (e) direct from
  the native broker, everything but the one record per partition read from remote storage.

Rounds (`--repeats`) interleave the cases (a, e, c, x, b, d, t, f, w, W, then again), so every
side sees the same noise. In each round each case replays twice: "cold" is the first
replay (the proxy a fresh process with empty caches; Kafka's RemoteIndexCache is empty
only in the first round), "warm" the second right after it. Segment files are in the OS
page cache in every case. Each row gives the best MB/s of its rounds, with the CPU seconds
per GB of the broker and of the proxy (every process of it) in that replay. After each
proxy replay the proxy's metrics count remote reads and how many ran out of
`remote.fetch.max.wait.ms`. `--client-config KEY=VALUE` sets a consumer property in every
case (e.g. `fetch.wait.max.ms=100`).

    .venv/bin/python benchmarks/backfill.py --mb 300 --partitions 1,8 --cases aec
    .venv/bin/python benchmarks/backfill.py --mb 300 --partitions 1 --cases cx   # decryption's cost

With local-file cases, each round also measures the floor (`floor.py`): the remote segment
files pread into one buffer and sent over loopback by a process doing nothing else, and
the same bytes sent from memory; the proxy's CPU per GB is given as a multiple of it. With
(t) too, the TLS floor: the same bytes received over loopback TLS 1.3 (AES-GCM) and
decrypted with `recv_into` into one reused buffer; (t) is given against it and against (c).

Targets: (c) proxy CPU <= 2.5x the pread + send floor cold, <= 1.5x warm; (c) >= 1.5x (e)
and >= 0.9x (a) in MB/s; (x) at most 0.3 proxy CPU s/GB above (c) (AES-GCM with AES-NI
decrypts at GB/s); S3: (d) proxy CPU <= 1.2x (c), (t) <= 1.5x (c) and <= 2x the TLS floor,
(f) >= 0.9x (a) in MB/s at 1 partition cold and >= 1.0x at 8. Everything it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmark_data import MB, produce  # beside this script
from floor import floor_seconds_per_gb, tls_floor_seconds_per_gb  # beside this script
import profiling  # beside this script

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CASES = (
    ("a", "direct from the broker"),
    ("e", "Kafka native tiered storage"),
    ("c", "proxy, remote from local files"),
    ("x", "proxy, remote encrypted, local files"),
    ("b", "proxy, tail (local on the broker)"),
    ("d", "proxy, remote from S3 (S3Proxy)"),
    ("t", "proxy, remote from S3 over TLS"),
    ("f", "proxy, remote from S3, 20 ms first byte"),
    ("w", "proxy, remote, 4 replays, 1 worker"),
    ("W", "proxy, remote, 4 replays, 2 workers"),
)
SEGMENT_BYTES = 16 * 1024 * 1024  # remote segments on both sides
# Each broker sits paused (SIGSTOP) while the other side's cases run; its controller
# must not fence it for missed heartbeats when it continues (clients then see it down).
PAUSE_PROOF = {"broker.session.timeout.ms": str(600_000)}
CONCURRENT_REPLAYS = 4  # cases w and W
# Kafka's documented production JVM settings ("Java Version" in its operations docs).
KAFKA_G1 = ("-Xmx6g", "-Xms6g", "-XX:MetaspaceSize=96m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35", "-XX:G1HeapRegionSize=16M", "-XX:MinMetaspaceFreeRatio=50",
            "-XX:MaxMetaspaceFreeRatio=80", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")


def native_broker_config(remote_dir: Path) -> dict[str, str]:
    """Kafka's own tiered storage on one testbed broker (KIP-405 configs)."""
    return {
        "remote.log.storage.system.enable": "true",
        "remote.log.storage.manager.class.name": "org.apache.kafka.server.log.remote.storage.LocalTieredStorage",
        "rsm.config.dir": str(remote_dir),
        "remote.log.metadata.manager.listener.name": "INTERNAL",
        "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
        "rlmm.config.remote.log.metadata.topic.num.partitions": "5",
        "remote.log.manager.task.interval.ms": "500",
        "log.retention.check.interval.ms": "500",
        "log.segment.bytes": str(SEGMENT_BYTES),
        **PAUSE_PROOF,
    }


def native_topic_config() -> dict[str, str]:
    return {"remote.storage.enable": "true", "local.retention.bytes": "1", "segment.bytes": str(SEGMENT_BYTES),
            "segment.ms": "1000"}


def tier_natively(bootstrap: str, log_dir: Path, topic: str, partitions: int, timeout_s: float = 900.0) -> int:
    """Roll every partition's last segment with one more record, then wait until Kafka has
    tiered and deleted locally every segment before it (Kafka deletes a local segment only
    once it is copied); returns the records added."""
    from confluent_kafka import Producer

    time.sleep(1.5)  # past segment.ms, so the next append rolls
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(partitions):
        producer.produce(topic, value=b"roll", key=b"roll", partition=partition)
    if producer.flush(30):
        raise RuntimeError("the rolling records were not delivered")
    deadline = time.monotonic() + timeout_s
    while True:
        local = {p: len(list((log_dir / f"{topic}-{p}").glob("*.log"))) for p in range(partitions)}
        if all(count == 1 for count in local.values()):
            return partitions
        if time.monotonic() > deadline:
            raise RuntimeError(f"Kafka did not tier {topic} within {timeout_s:.0f} s: local segments {local}")
        time.sleep(1.0)


def properties_for(tmp: Path, bootstrap: str, topic: str, backend: str, s3) -> dict[str, str]:
    """One configuration per backend: the pipeline copies with it, the proxy serves with it."""
    node_port = _free_port()
    properties = {
        "bootstrap.servers": bootstrap,
        "proxy.listener.host": "127.0.0.1",
        "proxy.bootstrap.port": str(_free_port()),
        "proxy.broker.port.base": str(node_port),  # one broker: node 0
        "metrics.port": str(_free_port()),  # scraped after each replay (proxy_counters)
        "remote.log.metadata.backend": "file",
        "remote.log.metadata.dir": str(tmp / f"metadata-{backend}"),
        f"topic.{topic}.remote.storage.enable": "true",
        f"topic.{topic}.segment.bytes": str(SEGMENT_BYTES),
        # Kafka's roll rule by time, as on the native side: segments are cut by size, and the
        # last one ships once its first batch is a second old (every byte goes remote).
        f"topic.{topic}.segment.ms": "1000",
    }
    if backend == "local":
        properties |= {"remote.log.storage.backend": "local", "remote.log.storage.local.dir": str(tmp / "remote")}
    elif backend == "local-encrypted":
        key = tmp / "keys" / "backfill.key"
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")  # openssl rand -base64 32
        properties |= {"remote.log.storage.backend": "local", "remote.log.storage.local.dir": str(tmp / "remote-encrypted"),
                       "remote.log.storage.encryption.keys": f"backfill:{key}",
                       "remote.log.storage.encryption.active.key": "backfill"}
    else:
        properties |= s3.storage_properties(f"backfill-{topic}")
    return properties


def _free_port() -> int:
    from testbed.ports import free_port

    return free_port()


async def tier_everything(properties: dict[str, str]) -> int:
    """Copy and commit every partition of the tiered topic; returns the bytes copied."""
    from tierproxy.client.cluster import Cluster
    from tierproxy.pipeline.commit import commit_partition
    from tierproxy.pipeline.copy import metadata_manager, run_copy
    from tierproxy.pipeline.plan import plan_pass
    from tierproxy.config import parse
    from tierproxy.storage.factory import remote_storage_manager

    config = parse(properties)
    async with Cluster.from_config(config) as cluster, metadata_manager(config) as rlmm:
        plans = [p for p in await plan_pass(config, cluster, rlmm) if not p.empty]
    copied = 0
    results = []
    for plan in plans:
        result = await run_copy(config, plan)
        copied += result.bytes_copied
        results.append((plan, result))
    async with remote_storage_manager(config) as rsm, metadata_manager(config) as rlmm:
        for plan, result in results:
            commit = await commit_partition(rlmm, rsm, plan, result.metadata())
            if commit.error:
                raise RuntimeError(commit.error)
    return copied


async def trim_to_end(bootstrap: str, topic: str) -> dict[int, int]:
    """DeleteRecords up to each partition's log end: nothing is left local."""
    from tierproxy.client.cluster import Cluster
    from tierproxy.protocol.apis import OffsetSpec

    async with Cluster([bootstrap]) as cluster:
        topics = await cluster.topics([topic])
        tps = [(topic, p) for p in topics[topic].partitions]
        ends = await cluster.list_offsets(topics, tps, OffsetSpec.LATEST)
        trimmed = await cluster.delete_records(topics, {tp: ends[tp].offset for tp in tps})
    return {p: offset for (_, p), offset in trimmed.items()}


@contextmanager
def proxy_process(properties: dict[str, str], workdir: Path, profile: Path | None = None,
                  source: Path | None = None) -> Iterator[dict]:
    """`tierproxy serve` as a subprocess; yields {"bootstrap", "pid", "vm_hwm_kb"} (the
    last filled in just before the process is stopped). `source`: the checkout whose code
    it runs (this one unless given; its `tierproxy/` comes first on the path)."""
    from testbed.processes import spawn, stop_pids

    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "proxy.properties"
    properties = {"proxy.workers": "1", **properties}  # one process, unless a case asks for more
    config_path.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    command = [sys.executable, "-m", "tierproxy.cli", "serve", "--config", str(config_path)]
    if profile is not None:
        command = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "tierproxy.cli", "serve",
                   "--config", str(config_path)]
    log_path = workdir / "serve.log"
    process = spawn(command, log_path, cwd=source or Path(__file__).resolve().parent.parent)
    info = {"bootstrap": f"127.0.0.1:{properties['proxy.bootstrap.port']}", "pid": process.pid, "vm_hwm_kb": 0}
    try:
        _wait_for_port(int(properties["proxy.bootstrap.port"]), process, log_path)
        _wait_for_port(int(properties["proxy.broker.port.base"]), process, log_path)
        yield info
        info["vm_hwm_kb"] = _vm_hwm_kb(process.pid)
    finally:
        if profile is not None:  # SIGINT lets cProfile write its file
            process.send_signal(2)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                pass
        stop_pids([process.pid])


def _wait_for_port(port: int, process: subprocess.Popen, log_path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"tierproxy serve exited: {log_path.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"tierproxy serve does not listen on {port}")


def proxy_counters(port: int, wanted: dict[str, str] | None = None) -> dict[str, float]:
    """The proxy's own view of a replay, summed over labels: by default remote reads that ran
    out of `remote.fetch.max.wait.ms`, remote reads answered, and their total seconds;
    `wanted` maps other metric names to the keys they are returned under (a name with its
    labels, as the exposition writes them, `name{label="value"}`, takes only that series)."""
    import urllib.request

    if wanted is None:
        wanted = {"tierproxy_remote_fetch_expired_total": "expired",
                  "tierproxy_remote_read_seconds_count": "reads",
                  "tierproxy_remote_read_seconds_sum": "read_s"}
    totals = dict.fromkeys(wanted.values(), 0.0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            series, _, value = line.rpartition(" ")
            name = series.split("{", 1)[0]
            for key in {name, series}:  # a series without labels is its name: counted once
                if key in wanted:
                    totals[wanted[key]] += float(value)
    return totals


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat)."""
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def stat_cpu_seconds(stat: Path) -> float:
    """User + system CPU time in a /proc stat file: a process's, or one thread's
    (/proc/<pid>/task/<tid>/stat)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of a process and its children (the proxy's supervisor and workers)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    pids = [pid, *(int(c) for c in children.read_text().split())] if children.exists() else [pid]
    return sum(cpu_seconds(p) for p in pids)


def _vm_hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def replay(bootstrap: str, topic: str, expected_records: int, client_config: dict[str, str], *,
           consumers: int = 1, replays: int = 1):
    from tierproxy.loadtest import LoadTest

    # Runs last seconds: a finer statistics window than the command's default 1 s.
    summary = LoadTest(bootstrap, topic, consumers=consumers, replays=replays, stats_interval_ms=250,
                       client_config=client_config).run()
    if summary.records != expected_records * replays or summary.errors:
        raise RuntimeError(f"replay via {bootstrap}: {summary.records} records of {expected_records * replays}, "
                           f"errors {summary.errors}")
    return summary


class Measured:
    """One replay: the loadtest's summary and the CPU seconds of the broker, the proxy and (f)
    the latency relay between the proxy and the object store."""

    def __init__(self, summary, broker_cpu: float, proxy_cpu: float, counters: dict[str, float] | None,
                 relay_cpu: float | None = None) -> None:
        self.summary = summary
        self.broker_cpu = broker_cpu
        self.proxy_cpu = proxy_cpu
        self.counters = counters
        self.relay_cpu = relay_cpu

    def per_gb(self, seconds: float) -> float:
        return seconds / (self.summary.bytes / 1e9)


def measured_replays(bootstrap: str, topic: str, records: int, client_config: dict[str, str], broker_pid: int,
                     proxy: dict | None, metrics_port: int | None, replays: int,
                     relay_pid: int | None = None) -> list[Measured]:
    """A cold and a warm replay, back to back, on the same broker (and proxy process)."""
    out = []
    for _ in ("cold", "warm"):
        broker = cpu_seconds(broker_pid)
        proxy_cpu = tree_cpu_seconds(proxy["pid"]) if proxy else 0.0
        relay_cpu = cpu_seconds(relay_pid) if relay_pid else None
        summary = replay(bootstrap, topic, records, client_config, replays=replays)
        broker = cpu_seconds(broker_pid) - broker
        proxy_cpu = tree_cpu_seconds(proxy["pid"]) - proxy_cpu if proxy else 0.0
        if relay_cpu is not None:
            relay_cpu = cpu_seconds(relay_pid) - relay_cpu
        out.append(Measured(summary, broker, proxy_cpu, proxy_counters(metrics_port) if metrics_port else None,
                            relay_cpu))
    return out


@dataclass
class DataSet:
    """One partition count's topics: the same records on every side."""

    name: str  # the native broker's topic
    local_topic: str  # kept local on the broker: (a), (b)
    remote_topic: str  # tiered by the pipeline and trimmed: (c), (d), (w), (W)
    records: int
    partitions: int
    properties: dict[str, dict[str, str]]  # by backend: the pipeline's and the proxy's configuration
    workdir: Path


@contextmanager
def paused(pid: int) -> Iterator[None]:
    """A process stopped (SIGSTOP) for the block, then continued."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def run_case(case: str, round_: int, data: DataSet, kafka, native, relay, client_config: dict[str, str],
             profile_dir: str | None, py_spy_dir: str | None = None) -> list[Measured]:
    """A case's cold and warm replays."""
    replays = CONCURRENT_REPLAYS if case in "wW" else 1
    if case == "a":
        return measured_replays(kafka.bootstrap_servers, data.local_topic, data.records, client_config,
                                kafka.pids[0], None, None, replays)
    if case == "e":
        return measured_replays(native.bootstrap_servers, data.name, data.records + data.partitions, client_config,
                                native.pids[0], None, None, replays)
    backend = "s3" if case in "df" else "s3-tls" if case == "t" else "local-encrypted" if case == "x" else "local"
    serving = dict(data.properties.get(backend) or
                   properties_for(data.workdir, kafka.bootstrap_servers, data.remote_topic, "local", None))
    serving["proxy.workers"] = "2" if case == "W" else "1"
    # Ports picked when the proxy starts: taken at set-up, another server may hold them since.
    serving |= {"proxy.bootstrap.port": str(_free_port()), "proxy.broker.port.base": str(_free_port()),
                "metrics.port": str(_free_port())}
    if case == "f":  # the same objects, each GET's first byte held back by the relay
        serving["remote.log.storage.s3.endpoint.url"] = relay.endpoint_url
    profile = Path(profile_dir) / f"{data.name}-{case}-{round_}.prof" if profile_dir else None
    with proxy_process(serving, data.workdir / f"proxy-{case}-{round_}", profile) as proxy:
        raw = Path(py_spy_dir).resolve() / f"{data.name}-{case}-{round_}.raw" if py_spy_dir else None
        if raw is not None:
            raw.parent.mkdir(parents=True, exist_ok=True)
        with profiling.record(proxy["pid"], raw) if raw else contextlib.nullcontext():
            runs = measured_replays(proxy["bootstrap"], data.local_topic if case == "b" else data.remote_topic,
                                    data.records, client_config, kafka.pids[0], proxy, int(serving["metrics.port"]),
                                    replays, relay.pid if case == "f" else None)
    if raw is not None:
        print(f"  py-spy of the proxy ({case}, cold then warm): {raw}")
        print(profiling.format_summary(*profiling.summarize(raw), top=10), flush=True)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=300, help="MB per partition count (default 300)")
    parser.add_argument("--partitions", default="1,8", help="partition counts (default 1,8)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of interleaved cases; the best counts "
                                                             "(default 3)")
    parser.add_argument("--cases", default="aecxbdtf", help="case letters (default aecxbdtf; also w, W)")
    parser.add_argument("--first-byte-ms", type=float, default=20.0, help="the relay's latency in case (f)")
    parser.add_argument("--client-config", action="append", default=[], metavar="KEY=VALUE",
                        help="consumer setting for every case, e.g. fetch.wait.max.ms=100 (repeatable)")
    parser.add_argument("--proxy-config", action="append", default=[], metavar="KEY=VALUE",
                        help="proxy setting for every proxy case, e.g. remote.log.read.ahead.chunks=4 (repeatable)")
    parser.add_argument("--profile", metavar="DIR", help="run the proxy under cProfile, one file per round")
    parser.add_argument("--py-spy", metavar="DIR", help="record the proxy's processes with py-spy, one raw file "
                        "per case and round, and print the top of each profile")
    args = parser.parse_args()
    from tierproxy.loadtest import parse_client_config

    client_config = parse_client_config(args.client_config)
    cases = [(case, label) for case, label in CASES if case in args.cases]
    wanted = {case for case, _ in cases}

    from testbed.kafka import KafkaCluster
    from testbed.latency import LatencyRelay
    from testbed.s3proxy import S3ProxyServer

    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    print(f"machine: {platform.node()} {platform.machine()}, nproc {os.cpu_count()}, "
          f"python {platform.python_version()}, date {datetime.datetime.now().isoformat(timespec='seconds')}")
    rows = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="backfill-bench-")))
        kafka = stack.enter_context(KafkaCluster(1, broker_config={"log.segment.bytes": SEGMENT_BYTES, **PAUSE_PROOF},
                                                 jvm_options=KAFKA_G1))
        native = (stack.enter_context(KafkaCluster(1, broker_config=native_broker_config(tmp / "native"),
                                                   jvm_options=KAFKA_G1)) if "e" in wanted else None)
        s3 = stack.enter_context(S3ProxyServer(workdir=tmp / "s3proxy")) if wanted & set("df") else None
        s3_tls = stack.enter_context(S3ProxyServer(workdir=tmp / "s3proxy-tls", tls=True)) if "t" in wanted else None
        relay = (stack.enter_context(LatencyRelay(s3.endpoint_url, args.first_byte_ms, tmp / "relay"))
                 if "f" in wanted else None)
        for partitions in [int(p) for p in args.partitions.split(",")]:
            name = f"backfill-{partitions}p"
            local_topic, remote_topic = f"{name}-local", f"{name}-remote"
            records = 0
            for cluster, topic, config, needed in (
                    (kafka, local_topic, None, wanted & set("ab")),
                    (kafka, remote_topic, None, wanted & set("cxdtfwW")),
                    (native, name, native_topic_config(), native is not None)):
                if not needed:
                    continue
                cluster.create_topic(topic, partitions=partitions, config=config)
                started = time.perf_counter()
                records = produce(cluster.bootstrap_servers, topic, partitions, args.mb)
                print(f"\n{topic}: {records:,} records produced in {time.perf_counter() - started:.1f}s", flush=True)
            backends = [b for b, letters in (("local", "cwW"), ("local-encrypted", "x"), ("s3", "df"), ("s3-tls", "t"))
                        if wanted & set(letters)]
            properties = {b: properties_for(tmp / name, kafka.bootstrap_servers, remote_topic, b,
                                            s3_tls if b == "s3-tls" else s3)
                          for b in backends}
            if backends:
                time.sleep(1.1)  # past segment.ms: the last segment ships too
            for backend in backends:
                started = time.perf_counter()
                copied = asyncio.run(tier_everything(properties[backend]))
                print(f"  tiered {copied / MB:.1f} MB to {backend} in {time.perf_counter() - started:.1f}s",
                      flush=True)
            if backends:
                asyncio.run(trim_to_end(kafka.bootstrap_servers, remote_topic))
            if native is not None:
                started = time.perf_counter()
                extra = tier_natively(native.bootstrap_servers, native.log_dirs[0], name, partitions)
                print(f"  Kafka tiered {name} in {time.perf_counter() - started:.1f}s "
                      f"(after {extra} rolling records)", flush=True)
            for settings in properties.values():
                settings |= parse_client_config(args.proxy_config)
            data = DataSet(name, local_topic, remote_topic, records, partitions, properties, tmp / name)
            results: dict[tuple[str, str], list[Measured]] = {}
            # The floor, in the same run: the local store's segment files, pread into one
            # buffer and sent over loopback by a process that does nothing else (floor.py).
            floor_files = sorted((tmp / name / "remote").rglob("*.log")) if "local" in properties else []
            floors: dict[str, list[float]] = {"pread": [], "memory": [], "tls": []}
            for round_ in range(args.repeats):
                if floor_files:
                    with paused(kafka.pids[0]), paused(native.pids[0]) if native else contextlib.nullcontext():
                        floors["pread"] += floor_seconds_per_gb(floor_files, 1)
                        floors["memory"] += floor_seconds_per_gb(floor_files, 1, memory=True)
                        if "t" in wanted:  # the same bytes received over TLS 1.3, decrypted into one buffer
                            floors["tls"] += tls_floor_seconds_per_gb(floor_files, 1)
                    tls_floor = f", TLS receive {floors['tls'][-1]:.3f}" if floors["tls"] else ""
                    print(f"  round {round_ + 1} floor: pread + send {floors['pread'][-1]:.3f} CPU s/GB, "
                          f"send from memory {floors['memory'][-1]:.3f}{tls_floor}", flush=True)
                for case, label in cases:
                    # The broker a case does not read from is paused, so that its background
                    # work (Kafka's remote log tasks, G1) is not charged to the other side.
                    idle = kafka if case == "e" else native
                    with paused(idle.pids[0]) if idle is not None else contextlib.nullcontext():
                        runs = run_case(case, round_, data, kafka, native, relay, client_config, args.profile,
                                        args.py_spy)
                    for phase, run in zip(("cold", "warm"), runs):
                        results.setdefault((case, phase), []).append(run)
                        print(f"  round {round_ + 1} ({case}) {label:37} {phase}  {_line(run)}", flush=True)
            for phase in ("cold", "warm"):
                best = {case: max(runs, key=lambda r: r.summary.mb_per_s)
                        for (case, p), runs in results.items() if p == phase}
                for case, label in cases:
                    if case in best:
                        rows.append((partitions, case, label, phase, best[case], best.get("a"), best.get("e"),
                                     results[(case, phase)]))
            print_table(rows)
            if floors["pread"]:
                print_floor(partitions, floors, results)
            for cluster, topic in ((kafka, local_topic), (kafka, remote_topic), (native, name)):
                try:
                    if cluster is not None and topic in cluster.admin().list_topics(timeout=30).topics:
                        cluster.delete_topic(topic, timeout=120)
                except Exception as e:  # noqa: BLE001 - a topic left in a throwaway cluster costs nothing
                    print(f"  ({topic} not deleted: {type(e).__name__} {e})", flush=True)
    return 0


def print_table(rows: list) -> None:
    """The best round of each case (by MB/s), with the median MB/s and CPU of its rounds."""
    print()
    print("| partitions | case | replay | MB | MB/s best / median | vs (a) | vs (e) | fetch p50 / p99 ms "
          "| broker CPU s/GB | proxy CPU s/GB best / median | relay CPU s/GB best / median |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for partitions, case, label, phase, run, direct, native_run, runs in rows:
        summary = run.summary
        versus = [f"{summary.mb_per_s / other.summary.mb_per_s:.2f}" if other else "-" for other in (direct, native_run)]
        median_mbs = statistics.median(r.summary.mb_per_s for r in runs)
        proxy_cpus = [r.per_gb(r.proxy_cpu) for r in runs]
        relay_cpus = [r.per_gb(r.relay_cpu) for r in runs if r.relay_cpu is not None]
        relay = f"{min(relay_cpus):.2f} / {statistics.median(relay_cpus):.2f}" if relay_cpus else "-"
        print(f"| {partitions} | ({case}) {label} | {phase} | {summary.bytes / MB:.1f} | {summary.mb_per_s:.1f} / "
              f"{median_mbs:.1f} | {versus[0]} | {versus[1]} | {_ms(summary.fetch_latency_p50_ms)} / "
              f"{_ms(summary.fetch_latency_p99_ms)} | {run.per_gb(run.broker_cpu):.2f} | "
              f"{min(proxy_cpus):.2f} / {statistics.median(proxy_cpus):.2f} | {relay} |", flush=True)


def print_floor(partitions: int, floors: dict[str, list[float]], results: dict) -> None:
    """The floor of this run and each local-file proxy case's CPU as a multiple of it."""
    pread, memory = floors["pread"], floors["memory"]
    print()
    print(f"{partitions} partition(s), floor CPU s/GB: pread + send best {min(pread):.3f} / median "
          f"{statistics.median(pread):.3f}; send from memory best {min(memory):.3f} / median "
          f"{statistics.median(memory):.3f}")
    tls = floors["tls"]
    if tls:
        print(f"TLS receive floor (TLS 1.3, AES-GCM, recv_into one buffer) CPU s/GB: best {min(tls):.3f} / "
              f"median {statistics.median(tls):.3f}")
    for (case, phase), runs in sorted(results.items()):
        if case not in "cxdt":
            continue
        cpus = [r.per_gb(r.proxy_cpu) for r in runs]
        local = [r.per_gb(r.proxy_cpu) for r in results.get(("c", phase), [])]
        versus = [f"pread floor best {min(cpus) / min(pread):.2f}, median "
                  f"{statistics.median(cpus) / statistics.median(pread):.2f}"]
        if case in "dt" and local:
            versus.append(f"(c) best {min(cpus) / min(local):.2f}, median "
                          f"{statistics.median(cpus) / statistics.median(local):.2f}")
        if case == "t" and tls:
            versus.append(f"TLS floor best {min(cpus) / min(tls):.2f}, median "
                          f"{statistics.median(cpus) / statistics.median(tls):.2f}")
        print(f"  ({case}) {phase}: proxy CPU / " + "; / ".join(versus))


def _line(run: Measured) -> str:
    summary = run.summary
    line = (f"{summary.mb_per_s:7.1f} MB/s  {summary.seconds:5.2f}s  fetch p50/p99 "
            f"{_ms(summary.fetch_latency_p50_ms)}/{_ms(summary.fetch_latency_p99_ms)} ms  "
            f"broker CPU {run.broker_cpu:.2f}s")
    if run.counters is not None:
        counters = run.counters
        line += (f"  proxy CPU {run.proxy_cpu:.2f}s, remote reads {counters['reads']:.0f} "
                 f"({counters['expired']:.0f} expired, mean "
                 f"{_ms(1000 * counters['read_s'] / max(counters['reads'], 1))} ms)")
    if run.relay_cpu is not None:
        line += f", relay CPU {run.relay_cpu:.2f}s"
    return line


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    sys.exit(main())
