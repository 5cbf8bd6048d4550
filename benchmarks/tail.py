"""Consumers at the tail of many partitions, direct and through the proxy.

One run starts a testbed broker, creates a topic of `--partitions` partitions (500), and
produces `--rate` records per second (1 KiB each, spread over every partition,
librdkafka, straight to the broker) for the whole run. Two consumers read the tail of
every partition, each directly and through a `tierproxy serve` subprocess, interleaved
(java direct, java proxy, librdkafka direct, librdkafka proxy, then again):

- java: kafka-clients from the testbed's jars (`TailLatency.java`), which uses fetch
  sessions (KIP-227): after a full fetch, incremental requests name only the partitions
  whose position moved;
- librdkafka: confluent-kafka, which never uses sessions (every request names every
  partition).

Per case, over a window that opens `--warmup` seconds after the consumer started: records,
end-to-end latency p50/p99/max (receive time minus the record's CreateTime), the consumer's
own counts of requests, Fetch requests and request bytes, and the CPU seconds of the
broker and of the proxy read when the window opens and closes. Per Fetch: CPU seconds of
a process over the window divided by the consumer's Fetch requests in it. Per-window CPU
misleads: a CPU-starved proxy slows the consumer's fetch rate and with it the broker's
CPU. Best and median of `--repeats` per case.

    .venv/bin/python benchmarks/tail.py --partitions 500 --rate 2000 --seconds 30

`--py-spy DIR` records the proxy with py-spy during every proxied case
(`DIR/CLIENT-ROUND.raw`, `DIR/CLIENT-ROUND-baseline.raw`) and prints the top of each profile
(`profiling.format_summary`).

`--baseline TREE` runs a third route in every round: a second proxy with the code of another
checkout (`git worktree add` or `git archive` of the commit to compare against, its compiled
modules beside their sources), so that a change is measured against the code before it under
the same load, case by case; the summary gives their CPU per Fetch against each other too.

Targets (issue 34): for each consumer, latency p50 within direct + 0.5 ms, p99 and max no
worse than direct's in the same run; proxy CPU per Fetch <= 0.12x the broker's CPU per Fetch
when the same consumer reads directly (same run); request bytes within 1.5x of direct.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import profiling  # beside this script
from backfill import cpu_seconds, proxy_process

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

JAVA_CONSUMER = Path(__file__).resolve().parent / "TailLatency.java"
VALUE = os.urandom(1024)


class SteadyProducer(threading.Thread):
    """`rate` records per second over every partition until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int) -> None:
        super().__init__(name="producer", daemon=True)
        self.bootstrap, self.topic, self.partitions, self.rate = bootstrap, topic, partitions, rate
        self.stopped = threading.Event()
        self.sent = 0
        self.delivered = 0

    def _on_delivery(self, error, _message) -> None:
        if error is None:
            self.delivered += 1

    def caught_up(self) -> bool:
        """No more than a tenth of a second's records waiting for the broker."""
        return self.sent - self.delivered <= self.rate / 10

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, "acks": 1})
        started = time.monotonic()
        while not self.stopped.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while self.sent < due:
                try:
                    producer.produce(self.topic, VALUE, partition=self.sent % self.partitions,
                                     on_delivery=self._on_delivery)
                except BufferError:  # librdkafka's queue is full: a starved broker; catch up later
                    break
                self.sent += 1
            producer.poll(0)
            time.sleep(0.005)
        producer.flush(10)


class Window:
    """CPU seconds of the broker and the proxy between `open()` and `close()`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.cpu: dict[str, float] = {}
        self._opened: dict[str, float] = {}

    def open(self) -> None:
        self._opened = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def close(self) -> None:
        self.cpu = {f"{name}_cpu_s": cpu_seconds(pid) - self._opened[name] for name, pid in self.pids.items()}


def proxy_properties(bootstrap: str, tmp: Path) -> dict[str, str]:
    """A proxy in front of `bootstrap` on ports of its own, with an empty remote tier in `tmp`."""
    from testbed.ports import free_port

    return {
        "bootstrap.servers": bootstrap,
        "proxy.listener.host": "127.0.0.1",
        "proxy.bootstrap.port": str(free_port()),
        "proxy.broker.port.base": str(free_port()),
        "metrics.port": "0",
        "remote.log.storage.backend": "local",
        "remote.log.storage.local.dir": str(tmp / "remote"),
        "remote.log.metadata.backend": "file",
        "remote.log.metadata.dir": str(tmp / "metadata"),
    }


def java_case(kafka, bootstrap: str, topic: str, warmup: int, seconds: int, window: Window) -> dict:
    command = kafka.java_tool_command(str(JAVA_CONSUMER), bootstrap, topic, str(warmup), str(seconds))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL)
    try:
        lines = []
        for line in process.stdout:
            line = line.strip()
            if line == "window start":
                window.open()
            elif line == "window end":
                window.close()
            elif line:
                lines.append(line)
        if process.wait(timeout=warmup + seconds + 120) != 0 or not window.cpu:
            raise RuntimeError(f"TailLatency.java failed: {process.stderr.read()[-2000:]}")
    finally:
        if process.poll() is None:
            process.kill()
    return json.loads(lines[-1])


def librdkafka_case(bootstrap: str, topic: str, partitions: int, warmup: int, seconds: int, window: Window) -> dict:
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition

    # (time, requests, request bytes, Fetch requests) per statistics callback
    counters: list[tuple[float, int, int, int]] = []

    def on_stats(document: str) -> None:
        brokers = [b for b in json.loads(document)["brokers"].values() if b.get("nodeid", -1) >= 0]
        counters.append((time.monotonic(), sum(b["tx"] for b in brokers), sum(b["txbytes"] for b in brokers),
                         sum(b.get("req", {}).get("Fetch", 0) for b in brokers)))

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"tail-{os.getpid()}-{time.time_ns()}",
                         "enable.auto.commit": False, "statistics.interval.ms": 1000, "stats_cb": on_stats})
    consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(partitions)])
    latencies: list[int] = []
    start = time.monotonic() + warmup
    end = start + seconds
    opened = False
    try:
        while (now := time.monotonic()) < end:
            if not opened and now >= start:
                window.open()
                opened = True
            for message in consumer.consume(1000, timeout=0.1):
                if message.error() is None and opened:
                    latencies.append(int(time.time() * 1000) - message.timestamp()[1])
        window.close()
    finally:
        consumer.close()
    # Statistics come once a second: the counts of the whole seconds inside the window.
    inside = [c for c in counters if start <= c[0] <= end]
    first, last = (inside[0], inside[-1]) if len(inside) > 1 else (None, None)
    latencies.sort()
    row = {"records": len(latencies), "p50_ms": _quantile(latencies, 0.50), "p99_ms": _quantile(latencies, 0.99),
           "max_ms": _quantile(latencies, 1.0),
           "request_bytes": last[2] - first[2] if first else None,
           "requests": last[1] - first[1] if first else None,
           "fetches": last[3] - first[3] if first else None}
    if first:
        # scale the counts to the whole window the CPU was read over
        scale = seconds / max(last[0] - first[0], 1e-3)
        row.update({k: row[k] * scale for k in ("request_bytes", "requests", "fetches")})
    return row


def _quantile(values: list[int], q: float) -> int | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=500)
    parser.add_argument("--rate", type=int, default=2000, help="records (1 KiB) per second (default 2000)")
    parser.add_argument("--seconds", type=int, default=30, help="measured seconds per case (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="seconds before measuring (default 5)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--clients", default="java,librdkafka")
    parser.add_argument("--py-spy", type=Path, metavar="DIR",
                        help="record the proxy with py-spy during every proxied case, into DIR")
    parser.add_argument("--py-spy-top", type=int, default=10, help="profile lines printed per case (default 10)")
    parser.add_argument("--baseline", type=Path, metavar="TREE",
                        help="also run a proxy with the code of this checkout, as a route of its own")
    args = parser.parse_args()
    if args.py_spy is not None:
        args.py_spy.mkdir(parents=True, exist_ok=True)

    from testbed.kafka import KafkaCluster

    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    print(f"machine: {platform.node()} {platform.machine()}, nproc {os.cpu_count()}, "
          f"python {platform.python_version()}, date {datetime.datetime.now().isoformat(timespec='seconds')}")
    clients = args.clients.split(",")
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="tail-bench-") as tmp_name, KafkaCluster(1) as kafka:
        tmp = Path(tmp_name)
        topic = "tail"
        kafka.create_topic(topic, partitions=args.partitions)
        properties = proxy_properties(kafka.bootstrap_servers, tmp)
        broker_pid = kafka.pids[0]
        producer = SteadyProducer(kafka.bootstrap_servers, topic, args.partitions, args.rate)
        producer.start()
        time.sleep(args.warmup)  # leaders known, the producer's first batches out
        # Until the first batches of a new topic's 500 leaders are all written, the producer lags
        # and then catches up in a burst, which the first case would read as a backlog.
        deadline = time.monotonic() + 120
        while not producer.caught_up():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the producer did not catch up: {producer.sent - producer.delivered} "
                                   "records waiting")
            time.sleep(0.1)
        try:
            with contextlib.ExitStack() as proxies:
                proxy = proxies.enter_context(proxy_process(properties, tmp / "proxy"))
                routes = {"direct": (kafka.bootstrap_servers, proxy["pid"]),
                          "proxy": (proxy["bootstrap"], proxy["pid"])}
                if args.baseline is not None:
                    baseline = proxies.enter_context(proxy_process(
                        proxy_properties(kafka.bootstrap_servers, tmp), tmp / "baseline", source=args.baseline))
                    routes["baseline"] = (baseline["bootstrap"], baseline["pid"])
                for attempt in range(args.repeats):
                    for client in clients:
                        for route, (bootstrap, proxy_pid) in routes.items():
                            window = Window({"broker": broker_pid, "proxy": proxy_pid})
                            raw = None
                            if args.py_spy is not None and route != "direct":
                                suffix = "" if route == "proxy" else f"-{route}"
                                raw = args.py_spy / f"{client}-{attempt + 1}{suffix}.raw"
                            with profiling.record(proxy_pid, raw) if raw else contextlib.nullcontext():
                                if client == "java":
                                    row = java_case(kafka, bootstrap, topic, args.warmup, args.seconds, window)
                                else:
                                    row = librdkafka_case(bootstrap, topic, args.partitions, args.warmup,
                                                          args.seconds, window)
                            row.update(window.cpu)
                            results.setdefault((client, route), []).append(row)
                            print(f"  [{attempt + 1}] {client:10} {route:6} {_row(row)}", flush=True)
                            if raw is not None:
                                print(f"  py-spy of the proxy, {raw}:")
                                print(textwrap.indent(profiling.format_summary(
                                    *profiling.summarize(raw), top=args.py_spy_top), "    "), flush=True)
        finally:
            producer.stopped.set()
            producer.join(30)
    print()
    print(f"{args.partitions} partitions, {args.rate} records/s of 1 KiB, {args.seconds} s measured per case, "
          f"{args.repeats} rounds; CPU per Fetch in ms (CPU seconds over the window / the consumer's Fetch "
          f"requests in it)")
    print()
    print("| consumer | route | round | records | latency p50 / p99 / max ms | Fetch requests | bytes per request "
          "| broker CPU s | proxy CPU s | broker ms / Fetch | proxy ms / Fetch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (client, route), rows in results.items():
        for i, row in enumerate(rows, 1):
            print(f"| {client} | {route} | {i} | {row['records']:,} | {_latency(row)} | "
                  f"{_fmt(row.get('fetches'), '.0f')} | {_per_request(row)} | {row['broker_cpu_s']:.2f} | "
                  f"{row['proxy_cpu_s']:.2f} | {_fmt(_per_fetch(row, 'broker'), '.3f')} | "
                  f"{_fmt(_per_fetch(row, 'proxy'), '.3f')} |")
    print()
    # A case that read more than the window's production read a backlog (a producer that fell
    # behind and caught up inside the window): not the tail, left out.
    expected = args.rate * args.seconds
    for (client, route), rows in results.items():
        for i, row in enumerate(rows, 1):
            if row["records"] > BACKLOG * expected:
                print(f"left out of the ratios: {client} {route} round {i}, {row['records']:,} records read "
                      f"against {expected:,} produced in its window (a backlog)")
    def kept(client: str, route: str) -> list[dict]:
        return [r for r in results.get((client, route), []) if r["records"] <= BACKLOG * expected]

    for client in clients:
        direct = kept(client, "direct")
        for route in [r for r in routes if r != "direct"]:
            proxied = kept(client, route)
            if not direct or not proxied:
                continue
            broker_per_fetch = [v for r in direct if (v := _per_fetch(r, "broker")) is not None]
            ratios = _ratios(_proxy_per_fetch(proxied), broker_per_fetch)
            size = _ratios([_bytes(r) for r in proxied], [_bytes(r) for r in direct])
            latency = []
            for key, target in LATENCY_TARGETS_MS.items():
                delta = _deltas([r[key] for r in proxied], [r[key] for r in direct])
                latency.append(f"{key[:-3]} {route} - direct best {_fmt(_best(delta), '.1f')} ms, median "
                               f"{_fmt(_median(delta), '.1f')} ms (target <= {target:g})")
            print(f"{client}: {route} CPU per Fetch / broker CPU per Fetch (direct) best {_fmt(_best(ratios))}, "
                  f"median {_fmt(_median(ratios))} (target <= {CPU_TARGET}); {'; '.join(latency)}; bytes per "
                  f"request {route} / direct median {_fmt(_median(size))} (target <= 1.5)")
        if "baseline" in routes:
            # Round by round: the two proxies' cases of a round ran next to each other.
            paired = [a / b for ours, theirs in zip(results.get((client, "proxy"), []),
                                                    results.get((client, "baseline"), []))
                      if (a := _per_fetch(ours, "proxy")) is not None and (b := _per_fetch(theirs, "proxy"))]
            print(f"{client}: proxy CPU per Fetch / baseline's, round by round: "
                  f"{', '.join(_fmt(v) for v in paired)} (median {_fmt(_median(paired))})")
    return 0


# Latency through the proxy minus direct's, in ms, at most (issue 34: p99 and max no worse).
LATENCY_TARGETS_MS = {"p50_ms": 0.5, "p99_ms": 0, "max_ms": 0}
# Proxy CPU per Fetch against the broker's (direct, same run), at most (issue 34).
CPU_TARGET = 0.12


def _proxy_per_fetch(rows: list[dict]) -> list[float]:
    return [v for r in rows if (v := _per_fetch(r, "proxy")) is not None]


# Records read in a window, against those produced in it, above which a case read a backlog.
BACKLOG = 1.2


def _per_fetch(row: dict, process: str) -> float | None:
    """Milliseconds of CPU per Fetch request of the consumer."""
    return row[f"{process}_cpu_s"] * 1000 / row["fetches"] if row.get("fetches") else None


def _bytes(row: dict) -> float | None:
    return row["request_bytes"] / row["requests"] if row.get("requests") else None


def _ratios(ours: list, theirs: list) -> list[float]:
    """Every round against every round of the other route: interleaved rounds share no pairing."""
    return [a / b for a in ours if a is not None for b in theirs if b]


def _deltas(ours: list, theirs: list) -> list[float]:
    return [a - b for a in ours if a is not None for b in theirs if b is not None]


def _best(values: list[float]) -> float | None:
    return min(values) if values else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _per_request(row: dict) -> str:
    return _fmt(_bytes(row), ",.0f")


def _latency(row: dict) -> str:
    return f"{row['p50_ms']} / {row['p99_ms']} / {row.get('max_ms')}"


def _row(row: dict) -> str:
    return (f"records {row['records']:,}  p50/p99/max {_latency(row).replace(' ', '')} ms  "
            f"fetches {_fmt(row.get('fetches'), '.0f')}  bytes/request {_per_request(row)}  "
            f"broker CPU {row['broker_cpu_s']:.2f}s ({_fmt(_per_fetch(row, 'broker'), '.3f')} ms/Fetch)  "
            f"proxy CPU {row['proxy_cpu_s']:.2f}s ({_fmt(_per_fetch(row, 'proxy'), '.3f')} ms/Fetch)")


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


if __name__ == "__main__":
    sys.exit(main())
