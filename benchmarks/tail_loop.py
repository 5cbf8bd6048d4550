"""A fetch session at the tail of many partitions, a fixed number of Fetches per case: CPU
per Fetch of the proxy against the broker's, and against another checkout's proxy.

`tail.py` runs real consumers over a time window; on a busy machine their fetch rates move
with the load (a starved consumer sends fewer, larger Fetches) and every per-Fetch figure
with them. Here one client plays the Java consumer's session (Fetch v12: a full fetch at
the log end, then incremental ones naming only the partitions whose position moved,
max_wait 500 ms, min_bytes 1) and sends exactly `--fetches` Fetches per case while
`--rate` records a second (1 KiB) arrive over every partition; the CPU seconds of the
broker and of the proxy are read around those Fetches. The bytes a Fetch carries still
vary with the load (a slower round trip finds more records); `--rate 0 --max-wait-ms 0`
leaves only what every Fetch costs whatever it carries: each answer is an empty
incremental one. Routes, interleaved, `--repeats`
rounds: direct, proxy, and with `--baseline TREE` a second proxy running the code of
another checkout (see tail.py).

    .venv/bin/python benchmarks/tail_loop.py --partitions 500 --fetches 3000 --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from backfill import cpu_seconds, proxy_process
from tail import SteadyProducer, proxy_properties

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


async def session_case(bootstrap: str, broker: str, topic: str, partitions: int, fetches: int, max_wait_ms: int,
                       pids: dict[str, int]) -> dict:
    """`fetches` Fetches of one session at the tail; CPU seconds of each of `pids` over them."""
    from kio.schema.fetch.v12 import request as fetch
    from kio.static.primitive import i8, i32, i64

    from tierproxy.client.cluster import Cluster
    from tierproxy.client.connection import KafkaConnection
    from tierproxy.client.queries import ClusterError
    from tierproxy.config.addresses import parse_host_port
    from tierproxy.protocol.apis import OffsetSpec
    from tierproxy.protocol.records import iter_batches
    from tierproxy.protocol.requests import milliseconds

    deadline = time.monotonic() + 60
    async with Cluster([broker]) as cluster:
        while True:  # a new topic's leaders take a moment
            try:
                topics = await cluster.topics([topic])
                latest = await cluster.list_offsets(topics, [(topic, p) for p in range(partitions)],
                                                    OffsetSpec.LATEST)
                break
            except ClusterError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
    positions = {p: latest[(topic, p)].offset for p in range(partitions)}

    def request(named: dict[int, int], session_id: int, epoch: int) -> fetch.FetchRequest:
        return fetch.FetchRequest(
            max_wait=milliseconds(max_wait_ms), min_bytes=i32(1), max_bytes=i32(50 << 20), isolation_level=i8(0),
            session_id=i32(session_id), session_epoch=i32(epoch),
            topics=(fetch.FetchTopic(topic=topic, partitions=tuple(
                fetch.FetchPartition(partition=i32(p), fetch_offset=i64(o), partition_max_bytes=i32(1 << 20))
                for p, o in named.items())),) if named else (),
            forgotten_topics_data=())

    records = 0
    latencies: list[float] = []
    async with await KafkaConnection.open(*parse_host_port(bootstrap)) as conn:
        response = await conn.request(request(positions, 0, 0))
        session_id, epoch = response.session_id, 0
        started = {name: cpu_seconds(pid) for name, pid in pids.items()}
        for _ in range(fetches):
            moved = {}
            for topic_response in response.responses:
                for partition in topic_response.partitions:
                    batches = list(iter_batches(partition.records or b""))
                    if batches:
                        records += sum(b.last_offset - max(b.base_offset, positions[partition.partition_index]) + 1
                                       for b in batches)
                        positions[partition.partition_index] = moved[partition.partition_index] = \
                            batches[-1].next_offset
            epoch += 1
            sent = time.perf_counter()
            response = await conn.request(request(moved, session_id, epoch))
            latencies.append(time.perf_counter() - sent)
            if response.error_code:
                raise RuntimeError(f"the session failed: error {response.error_code}")
        cpu = {f"{name}_cpu_s": cpu_seconds(pid) - started[name] for name, pid in pids.items()}
    latencies.sort()
    return {"records": records, "fetches": fetches, "p50_ms": latencies[len(latencies) // 2] * 1000,
            "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000, **cpu}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=500)
    parser.add_argument("--rate", type=int, default=2000, help="records (1 KiB) per second (default 2000)")
    parser.add_argument("--fetches", type=int, default=3000, help="Fetches per case (default 3000)")
    parser.add_argument("--max-wait-ms", type=int, default=500, help="the Fetches' max_wait_ms (default 500)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", type=Path, metavar="TREE",
                        help="also run a proxy with the code of this checkout, as a route of its own")
    args = parser.parse_args()

    from testbed.kafka import KafkaCluster

    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    print(f"machine: {platform.node()} {platform.machine()}, nproc {os.cpu_count()}, "
          f"python {platform.python_version()}, date {datetime.datetime.now().isoformat(timespec='seconds')}, "
          f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    rows: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="tail-loop-") as tmp_name, KafkaCluster(1) as kafka:
        tmp = Path(tmp_name)
        topic = "tail"
        kafka.create_topic(topic, partitions=args.partitions)

        producer = SteadyProducer(kafka.bootstrap_servers, topic, args.partitions, args.rate)
        producer.start()
        deadline = time.monotonic() + 120
        while args.rate and (not producer.caught_up() or producer.delivered < args.partitions):
            if time.monotonic() > deadline:
                raise RuntimeError("the producer did not catch up")
            time.sleep(0.1)
        try:
            with contextlib.ExitStack() as proxies:
                proxy = proxies.enter_context(proxy_process(proxy_properties(kafka.bootstrap_servers, tmp),
                                                            tmp / "proxy"))
                routes = {"direct": (kafka.bootstrap_servers, proxy["pid"]),
                          "proxy": (proxy["bootstrap"], proxy["pid"])}
                if args.baseline is not None:
                    baseline = proxies.enter_context(proxy_process(proxy_properties(kafka.bootstrap_servers, tmp),
                                                                   tmp / "baseline", source=args.baseline))
                    routes["baseline"] = (baseline["bootstrap"], baseline["pid"])
                for attempt in range(args.repeats):
                    for route, (bootstrap, proxy_pid) in routes.items():
                        row = asyncio.run(session_case(bootstrap, kafka.bootstrap_servers, topic, args.partitions,
                                                       args.fetches, args.max_wait_ms,
                                                       {"broker": kafka.pids[0], "proxy": proxy_pid}))
                        row["load"] = os.getloadavg()[0]
                        rows.setdefault(route, []).append(row)
                        print(f"  [{attempt + 1}] {route:8} {_row(row)}", flush=True)
        finally:
            producer.stopped.set()
            producer.join(30)
    print()
    print(f"{args.partitions} partitions, {args.rate} records/s of 1 KiB, {args.fetches} Fetches of one session per "
          f"case (max_wait_ms {args.max_wait_ms}), {args.repeats} rounds")
    print()
    print("| route | round | records | Fetch p50 / p99 ms | broker ms / Fetch | proxy ms / Fetch | load (1 min) |")
    print("|---|---|---|---|---|---|---|")
    for route, route_rows in rows.items():
        for i, row in enumerate(route_rows, 1):
            print(f"| {route} | {i} | {row['records']:,} | {row['p50_ms']:.2f} / {row['p99_ms']:.2f} | "
                  f"{_per_fetch(row, 'broker'):.3f} | {_per_fetch(row, 'proxy'):.3f} | {row['load']:.1f} |")
    print()
    broker = [_per_fetch(r, "broker") for r in rows["direct"]]
    for route in [r for r in rows if r != "direct"]:
        ratios = [_per_fetch(r, "proxy") / b for r in rows[route] for b in broker if b]
        print(f"{route}: proxy CPU per Fetch / broker CPU per Fetch (direct) best {min(ratios):.3f}, median "
              f"{statistics.median(ratios):.3f}")
    if "baseline" in rows:
        paired = [_per_fetch(a, "proxy") / _per_fetch(b, "proxy") for a, b in zip(rows["proxy"], rows["baseline"])]
        print(f"proxy CPU per Fetch / baseline's, round by round: {', '.join(f'{v:.2f}' for v in paired)} "
              f"(median {statistics.median(paired):.2f})")
    return 0


def _per_fetch(row: dict, process: str) -> float:
    return row[f"{process}_cpu_s"] * 1000 / row["fetches"]


def _row(row: dict) -> str:
    return (f"records {row['records']:,}  Fetch p50/p99 {row['p50_ms']:.2f}/{row['p99_ms']:.2f} ms  "
            f"broker {_per_fetch(row, 'broker'):.3f} ms/Fetch  proxy {_per_fetch(row, 'proxy'):.3f} ms/Fetch  "
            f"load {row['load']:.1f}")


if __name__ == "__main__":
    sys.exit(main())
