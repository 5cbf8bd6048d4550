"""Backfill throughput: the same consumer and the same data, direct and through the proxy.

One run starts a real broker (testbed, Kafka on loopback) and moto's S3 server, then for
each partition count (`--partitions 1,8`):

1. produces `--mb` MB of 1 KiB incompressible records (librdkafka, uncompressed, 1 MiB
   batches) into a new topic;
2. tiers every byte of it with the pipeline's copy task and commit (`pipeline.copy.run_copy`,
   `pipeline.commit.commit_partition`; what a `tierproxy tier` pass runs in its Spark tasks,
   here without Spark), once to local files and once to S3;
3. replays the topic from offset 0 with the loadtest's consumer (`tierproxy.loadtest.LoadTest`,
   confluent-kafka) in four cases:
   (a) direct from the broker;
   (b) through the proxy, tail: the data is still local on the broker;
   then the broker's log is trimmed to its end with DeleteRecords, and
   (c) through the proxy, remote from local files;
   (d) through the proxy, remote from S3.

The proxy runs as a `tierproxy serve` subprocess, started afresh for every replay (cold
caches); its peak RSS is VmHWM from /proc/<pid>/status just before it is stopped. Each case
is replayed `--repeats` times; the best MB/s counts (the machine is shared), RSS is the
largest seen. After each proxy replay its metrics endpoint is read: remote reads, how many
ran out of `remote.fetch.max.wait.ms`, their mean time. `--client-config KEY=VALUE` sets a
consumer property in every case (e.g. `fetch.wait.max.ms=100`).

    .venv/bin/python benchmarks/backfill.py --mb 300 --partitions 1,8

Targets: (b)/(a) >= 0.9 and (c)/(a) >= 1.0. Everything it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmark_data import MB, produce  # beside this script

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CASES = (
    ("a", "direct from the broker"),
    ("b", "proxy, tail (local on the broker)"),
    ("c", "proxy, remote from local files"),
    ("d", "proxy, remote from S3"),
)


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
        f"topic.{topic}.segment.bytes": str(64 * 1024 * 1024),
        f"topic.{topic}.segment.ms": "1",  # ship the last segment too: every byte goes remote
    }
    if backend == "local":
        properties |= {"remote.log.storage.backend": "local", "remote.log.storage.local.dir": str(tmp / "remote")}
    else:
        properties |= s3.storage_properties(f"backfill-{topic}")
    return properties


def _free_port() -> int:
    from testbed.ports import free_port

    return free_port()


async def tier_everything(properties: dict[str, str]) -> int:
    """Copy and commit every partition of the tiered topic; returns the bytes copied."""
    from client.cluster import Cluster
    from pipeline.commit import commit_partition
    from pipeline.copy import metadata_manager, run_copy
    from pipeline.plan import plan_pass
    from config import parse
    from storage.factory import remote_storage_manager

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
    from client.cluster import Cluster
    from protocol.apis import OffsetSpec

    async with Cluster([bootstrap]) as cluster:
        topics = await cluster.topics([topic])
        tps = [(topic, p) for p in topics[topic].partitions]
        ends = await cluster.list_offsets(topics, tps, OffsetSpec.LATEST)
        trimmed = await cluster.delete_records(topics, {tp: ends[tp].offset for tp in tps})
    return {p: offset for (_, p), offset in trimmed.items()}


@contextmanager
def proxy_process(properties: dict[str, str], workdir: Path, profile: Path | None = None) -> Iterator[dict]:
    """`tierproxy serve` as a subprocess; yields {"bootstrap", "pid", "vm_hwm_kb"} (the
    last filled in just before the process is stopped)."""
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
    process = spawn(command, log_path, cwd=Path(__file__).resolve().parent.parent)
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


def proxy_counters(port: int) -> dict[str, float]:
    """The proxy's own view of a replay, summed over labels: remote reads that ran out of
    `remote.fetch.max.wait.ms`, remote reads answered, and their total seconds."""
    import urllib.request

    wanted = {"tierproxy_remote_fetch_expired_total": "expired",
              "tierproxy_remote_read_seconds_count": "reads",
              "tierproxy_remote_read_seconds_sum": "read_s"}
    totals = dict.fromkeys(wanted.values(), 0.0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in wanted:
                totals[wanted[name]] += float(line.rsplit(" ", 1)[1])
    return totals


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _vm_hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def replay(bootstrap: str, topic: str, consumers: int, expected_records: int, client_config: dict[str, str]):
    from tierproxy.loadtest import LoadTest

    # Runs last seconds: a finer statistics window than the command's default 1 s.
    summary = LoadTest(bootstrap, topic, consumers=consumers, stats_interval_ms=250,
                       client_config=client_config).run()
    if summary.records != expected_records or summary.errors:
        raise RuntimeError(f"replay via {bootstrap}: {summary.records} records of {expected_records}, "
                           f"errors {summary.errors}")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=300, help="MB per partition count (default 300)")
    parser.add_argument("--partitions", default="1,8", help="partition counts (default 1,8)")
    parser.add_argument("--consumers", type=int, default=1, help="loadtest consumers (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="replays per case; the best counts (default 3)")
    parser.add_argument("--cases", default="abcd")
    parser.add_argument("--client-config", action="append", default=[], metavar="KEY=VALUE",
                        help="consumer setting for every case, e.g. fetch.wait.max.ms=100 (repeatable)")
    parser.add_argument("--profile", metavar="DIR", help="run the proxy under cProfile, one file per replay")
    args = parser.parse_args()
    from tierproxy.loadtest import parse_client_config

    client_config = parse_client_config(args.client_config)

    from testbed.kafka import KafkaCluster
    from testbed.s3 import S3Server

    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    print(f"machine: {platform.node()} {platform.machine()}, nproc {os.cpu_count()}, "
          f"python {platform.python_version()}, date {datetime.datetime.now().isoformat(timespec='seconds')}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="backfill-bench-") as tmp_name, \
            KafkaCluster(1, broker_config={"log.segment.bytes": 256 * 1024 * 1024}) as kafka, \
            S3Server() as s3:
        tmp = Path(tmp_name)
        for partitions in [int(p) for p in args.partitions.split(",")]:
            topic = f"backfill-{partitions}p"
            kafka.create_topic(topic, partitions=partitions)
            started = time.perf_counter()
            records = produce(kafka.bootstrap_servers, topic, partitions, args.mb)
            print(f"\n{topic}: {records:,} records produced in {time.perf_counter() - started:.1f}s", flush=True)
            properties = {backend: properties_for(tmp / topic, kafka.bootstrap_servers, topic, backend, s3)
                          for backend in ("local", "s3")}
            for backend in ("local", "s3") if set(args.cases) & set("cd") else ():
                started = time.perf_counter()
                copied = asyncio.run(tier_everything(properties[backend]))
                print(f"  tiered {copied / MB:.1f} MB to {backend} in {time.perf_counter() - started:.1f}s",
                      flush=True)
            results: dict[str, tuple[float, int | None, object]] = {}
            for case, label in CASES:
                if case not in args.cases:
                    continue
                if case == "c":
                    asyncio.run(trim_to_end(kafka.bootstrap_servers, topic))
                best, rss = None, None
                for attempt in range(args.repeats):
                    if case == "a":
                        summary = replay(kafka.bootstrap_servers, topic, args.consumers, records, client_config)
                    else:
                        backend = "s3" if case == "d" else "local"
                        profile = (Path(args.profile) / f"{topic}-{case}-{attempt}.prof"
                                   if args.profile else None)
                        with proxy_process(properties[backend], tmp / topic / f"proxy-{case}-{attempt}",
                                           profile) as proxy:
                            cpu = cpu_seconds(proxy["pid"])
                            summary = replay(proxy["bootstrap"], topic, args.consumers, records, client_config)
                            cpu = cpu_seconds(proxy["pid"]) - cpu
                            counters = proxy_counters(int(properties[backend]["metrics.port"]))
                        rss = max(rss or 0, proxy["vm_hwm_kb"])
                    print(f"  ({case}) {label:35} {summary.mb_per_s:7.1f} MB/s  {summary.seconds:5.2f}s  "
                          f"fetch p50/p99 {_ms(summary.fetch_latency_p50_ms)}/{_ms(summary.fetch_latency_p99_ms)} ms"
                          + (f"  proxy VmHWM {proxy['vm_hwm_kb'] / 1024:.0f} MiB, CPU {cpu:.2f}s, "
                             f"remote reads {counters['reads']:.0f} ({counters['expired']:.0f} expired, "
                             f"mean {_ms(1000 * counters['read_s'] / max(counters['reads'], 1))} ms)"
                             if case != "a" else ""),
                          flush=True)
                    if best is None or summary.mb_per_s > best.mb_per_s:
                        best = summary
                results[case] = (best.mb_per_s, rss, best)
            direct = results.get("a", (None,))[0]
            for case, label in CASES:
                if case in results:
                    rate, rss, best = results[case]
                    rows.append((partitions, case, label, best.bytes / MB, rate,
                                 rate / direct if direct else None, rss, best))
            kafka.delete_topic(topic)
    print()
    print("| partitions | case | MB | MB/s | ratio to (a) | fetch p50 / p99 ms | proxy peak RSS (VmHWM) |")
    print("|---|---|---|---|---|---|---|")
    for partitions, case, label, mb, rate, ratio, rss, best in rows:
        ratio_cell = f"{ratio:.2f}" if ratio is not None else "-"
        rss_cell = f"{rss / 1024:.0f} MiB" if rss else "-"
        print(f"| {partitions} | ({case}) {label} | {mb:.1f} | {rate:.1f} | {ratio_cell} | "
              f"{_ms(best.fetch_latency_p50_ms)} / {_ms(best.fetch_latency_p99_ms)} | {rss_cell} |")
    return 0


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    sys.exit(main())
