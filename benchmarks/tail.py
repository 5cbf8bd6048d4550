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

Per case, after `--warmup` seconds: records, end-to-end latency p50/p99 (receive time
minus the record's CreateTime), the consumer's own request bytes per request, and the
CPU seconds of the broker and of the proxy over the case. Best of `--repeats` per case.

    .venv/bin/python benchmarks/tail.py --partitions 500 --rate 2000 --seconds 30

Targets (issue "Fetch at production scale"): through the proxy, proxy CPU <= 0.2x the
broker's CPU for the same consumer; request bytes within 1.5x of direct; p99 within
direct + 5 ms.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

from backfill import cpu_seconds, proxy_process  # beside this script

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

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, "acks": 1})
        started = time.monotonic()
        while not self.stopped.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while self.sent < due:
                producer.produce(self.topic, VALUE, partition=self.sent % self.partitions)
                self.sent += 1
            producer.poll(0)
            time.sleep(0.005)
        producer.flush(10)


def java_case(kafka, bootstrap: str, topic: str, warmup: int, seconds: int) -> dict:
    result = kafka.java_tool(str(JAVA_CONSUMER), bootstrap, topic, str(warmup), str(seconds),
                             timeout=warmup + seconds + 120)
    if result.returncode != 0:
        raise RuntimeError(f"TailLatency.java failed: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def librdkafka_case(bootstrap: str, topic: str, partitions: int, warmup: int, seconds: int) -> dict:
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition

    counters: list[tuple[float, int, int]] = []  # (time, requests, request bytes) per statistics

    def on_stats(document: str) -> None:
        brokers = [b for b in json.loads(document)["brokers"].values() if b.get("nodeid", -1) >= 0]
        counters.append((time.monotonic(), sum(b["tx"] for b in brokers), sum(b["txbytes"] for b in brokers)))

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"tail-{os.getpid()}-{time.time_ns()}",
                         "enable.auto.commit": False, "statistics.interval.ms": 1000, "stats_cb": on_stats})
    consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(partitions)])
    latencies: list[int] = []
    start = time.monotonic() + warmup
    end = start + seconds
    try:
        while (now := time.monotonic()) < end:
            for message in consumer.consume(1000, timeout=0.1):
                if message.error() is None and now >= start:
                    latencies.append(int(time.time() * 1000) - message.timestamp()[1])
    finally:
        consumer.close()
    window = [c for c in counters if start <= c[0] <= end]
    latencies.sort()
    return {"records": len(latencies), "p50_ms": _quantile(latencies, 0.50), "p99_ms": _quantile(latencies, 0.99),
            "request_bytes": window[-1][2] - window[0][2] if len(window) > 1 else None,
            "requests": window[-1][1] - window[0][1] if len(window) > 1 else None}


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
    args = parser.parse_args()

    from testbed.kafka import KafkaCluster
    from testbed.ports import free_port

    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    print(f"machine: {platform.node()} {platform.machine()}, nproc {os.cpu_count()}, "
          f"python {platform.python_version()}, date {datetime.datetime.now().isoformat(timespec='seconds')}")
    clients = args.clients.split(",")
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="tail-bench-") as tmp_name, KafkaCluster(1) as kafka:
        tmp = Path(tmp_name)
        topic = "tail"
        kafka.create_topic(topic, partitions=args.partitions)
        properties = {
            "bootstrap.servers": kafka.bootstrap_servers,
            "proxy.listener.host": "127.0.0.1",
            "proxy.bootstrap.port": str(free_port()),
            "proxy.broker.port.base": str(free_port()),
            "metrics.port": "0",
            "remote.log.storage.backend": "local",
            "remote.log.storage.local.dir": str(tmp / "remote"),
            "remote.log.metadata.backend": "file",
            "remote.log.metadata.dir": str(tmp / "metadata"),
        }
        broker_pid = kafka.pids[0]
        producer = SteadyProducer(kafka.bootstrap_servers, topic, args.partitions, args.rate)
        producer.start()
        time.sleep(args.warmup)  # leaders known, the producer's first batches out
        try:
            with proxy_process(properties, tmp / "proxy") as proxy:
                routes = {"direct": kafka.bootstrap_servers, "proxy": proxy["bootstrap"]}
                for attempt in range(args.repeats):
                    for client in clients:
                        for route, bootstrap in routes.items():
                            broker_cpu, proxy_cpu = cpu_seconds(broker_pid), cpu_seconds(proxy["pid"])
                            if client == "java":
                                row = java_case(kafka, bootstrap, topic, args.warmup, args.seconds)
                            else:
                                row = librdkafka_case(bootstrap, topic, args.partitions, args.warmup, args.seconds)
                            row["broker_cpu_s"] = cpu_seconds(broker_pid) - broker_cpu
                            row["proxy_cpu_s"] = cpu_seconds(proxy["pid"]) - proxy_cpu
                            results.setdefault((client, route), []).append(row)
                            print(f"  [{attempt + 1}] {client:10} {route:6} {_row(row)}", flush=True)
        finally:
            producer.stopped.set()
            producer.join(30)
    print()
    print(f"{args.partitions} partitions, {args.rate} records/s of 1 KiB, {args.seconds} s measured per case, "
          f"best of {args.repeats} (lowest p99; CPU and request bytes of that case)")
    print()
    print("| consumer | route | records | latency p50 / p99 ms | bytes per request | broker CPU s | proxy CPU s |")
    print("|---|---|---|---|---|---|---|")
    best = {key: min(rows, key=lambda r: r["p99_ms"] if r["p99_ms"] is not None else 1e9)
            for key, rows in results.items()}
    for (client, route), row in best.items():
        print(f"| {client} | {route} | {row['records']:,} | {row['p50_ms']} / {row['p99_ms']} | "
              f"{_per_request(row)} | {row['broker_cpu_s']:.2f} | "
              f"{row['proxy_cpu_s']:.2f} |")
    print()
    for client in clients:
        direct, proxied = best.get((client, "direct")), best.get((client, "proxy"))
        if not direct or not proxied:
            continue
        cpu_ratio = proxied["proxy_cpu_s"] / max(proxied["broker_cpu_s"], 0.01)
        bytes_ratio = (proxied["request_bytes"] / direct["request_bytes"]
                       if proxied["request_bytes"] and direct["request_bytes"] else None)
        p99_delta = (proxied["p99_ms"] - direct["p99_ms"]
                     if proxied["p99_ms"] is not None and direct["p99_ms"] is not None else None)
        print(f"{client}: proxy CPU / broker CPU {cpu_ratio:.2f} (target <= 0.2); request bytes proxy / direct "
              f"{_fmt(bytes_ratio)} (target <= 1.5); p99 proxy - direct {p99_delta} ms (target <= 5)")
    return 0


def _per_request(row: dict) -> str:
    if not row.get("requests"):
        return "n/a"
    return f"{row['request_bytes'] / row['requests']:,.0f}"


def _row(row: dict) -> str:
    return (f"records {row['records']:,}  p50/p99 {row['p50_ms']}/{row['p99_ms']} ms  "
            f"bytes/request {_per_request(row)}  broker CPU {row['broker_cpu_s']:.2f}s  "
            f"proxy CPU {row['proxy_cpu_s']:.2f}s")


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
