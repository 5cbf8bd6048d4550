"""A backfill held to the remote fetch quota (KIP-956), window by window.

One run starts a real broker (testbed), produces `--mb` MB of 1 KiB records over
`--consumers` partitions, tiers all of it to local files with the pipeline's copy task and
trims the broker's log, then for each `--workers` count starts `tierproxy serve` with
`remote.log.manager.fetch.max.bytes.per.second` = `--quota` and lets one librdkafka consumer
a partition replay it from offset 0 (testbed.quota_replay). Per replay it prints the bytes
read from the store, the seconds, the whole run's rate / quota, the highest rate over one
quota window (`window.num` x `window.size.seconds`, after the first) / quota, the run's
duration / (bytes / quota), and the longest a consumer got nothing while others got records.

    .venv/bin/python benchmarks/fetch_quota.py --mb 80 --consumers 16 --quota 1000000 --workers 1,2

Targets: highest window <= 1.1x, duration >= 0.9x, longest wait <= 2 quota windows.
Everything it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backfill import _free_port, proxy_process, tier_everything, trim_to_end  # noqa: E402  beside this script
from benchmark_data import MB, RECORD_BYTES, produce  # noqa: E402

MIB = 1 << 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=80, help="MB of records tiered (default 80)")
    parser.add_argument("--consumers", type=int, default=16, help="partitions, one consumer each (default 16)")
    parser.add_argument("--quota", type=int, default=1_000_000, help="bytes per second (default 1000000)")
    parser.add_argument("--window-num", type=int, default=11)
    parser.add_argument("--window-size", type=int, default=1, help="seconds")
    parser.add_argument("--workers", default="1,2", help="proxy.workers counts, one replay each (default 1,2)")
    parser.add_argument("--proxy-config", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--client-config", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    from testbed.kafka import KafkaCluster
    from testbed.quota_replay import replay

    window_s = args.window_num * args.window_size
    rows = []
    with tempfile.TemporaryDirectory(prefix="tierproxy-fetch-quota-") as tmp_dir, KafkaCluster(1) as kafka:
        tmp = Path(tmp_dir)
        topic = "backfill"
        kafka.create_topic(topic, partitions=args.consumers)
        count = produce(kafka.bootstrap_servers, topic, args.consumers, args.mb)
        records = {p: count // args.consumers + (p < count % args.consumers) for p in range(args.consumers)}
        properties = {
            "bootstrap.servers": kafka.bootstrap_servers,
            "proxy.listener.host": "127.0.0.1", "proxy.bootstrap.port": str(_free_port()),
            "proxy.broker.port.base": str(_free_port()),
            "remote.log.storage.backend": "local", "remote.log.storage.local.dir": str(tmp / "remote"),
            "remote.log.metadata.backend": "file", "remote.log.metadata.dir": str(tmp / "metadata"),
            f"topic.{topic}.remote.storage.enable": "true",
            f"topic.{topic}.segment.bytes": str(8 * MIB), f"topic.{topic}.segment.ms": "1",
            "remote.log.manager.fetch.max.bytes.per.second": str(args.quota),
            "remote.log.manager.fetch.quota.window.num": str(args.window_num),
            "remote.log.manager.fetch.quota.window.size.seconds": str(args.window_size),
            **dict(item.split("=", 1) for item in args.proxy_config),
        }
        copied = asyncio.run(tier_everything(properties))
        asyncio.run(trim_to_end(kafka.bootstrap_servers, topic))
        print(f"{count} records of {RECORD_BYTES} B, {copied / MB:.1f} MB remote over {args.consumers} partitions; "
              f"quota {args.quota} B/s over {args.window_num} x {args.window_size} s", flush=True)
        for workers in (int(w) for w in args.workers.split(",")):
            metrics_port = _free_port()
            with proxy_process({**properties, "proxy.workers": str(workers), "metrics.port": str(metrics_port)},
                               tmp / f"proxy-{workers}") as proxy:
                result = replay(proxy["bootstrap"], topic, records, metrics_port, quota=args.quota,
                                window_s=window_s, consumer_config=dict(item.split("=", 1)
                                                                        for item in args.client_config))
            print(f"{workers} worker(s): {result.line()}", flush=True)
            rows.append((workers, result))

    print(f"\n# fetch quota run {datetime.date.today()}: {args.consumers} consumers, quota {args.quota} B/s, "
          f"window {args.window_num} x {args.window_size} s\n")
    print("| workers | store MB | seconds | whole run / quota | highest window / quota | duration / (bytes / quota) "
          "| longest wait s |")
    print("|---|---|---|---|---|---|---|")
    for workers, r in rows:
        print(f"| {workers} | {r.store_bytes / MB:.1f} | {r.seconds:.1f} | {r.whole_run:.2f} | {r.max_window:.2f} "
              f"| {r.duration:.2f} | {r.longest_wait_s:.1f} |")
    held = all(r.max_window <= 1.1 and r.duration >= 0.9 and r.longest_wait_s <= 2 * window_s for _, r in rows)
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
