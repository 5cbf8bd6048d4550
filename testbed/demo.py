"""The demo behind `make demo`: tiered storage end to end on this machine.

1. start a real Kafka broker (testbed) and create the topic `orders` (3 partitions);
2. produce sample orders;
3. run `tierproxy tier` (Spark local mode, local-file remote store, file metadata):
   it copies the data into remote segments and then trims the broker's local log, and
   appends the records of those segments to the Iceberg table `kafka.orders`, whose
   rows per partition are then printed (read with pyiceberg);
4. produce more orders (these stay on the broker);
5. start `tierproxy serve` and consume `orders` from offset 0 through it;
6. print how many records came from the remote tier and how many from the broker,
   check every produced record arrived exactly once, and stop everything.

With `--secure` nothing is plaintext: the broker's client listener is SASL_SSL (a CA
of the testbed's own), tierproxy logs in with SCRAM-SHA-512, segment metadata goes to
the `__remote_log_metadata` topic, the proxy's listener speaks TLS, and the consumer
logs in through the proxy with SCRAM-SHA-256.

    python -m testbed.demo [--records N] [--keep DIR] [--secure]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import javaproperties
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from tierproxy.client.security import aiokafka_options
from tierproxy.config import Config, parse
from testbed.kafka import KafkaCluster
from testbed.ports import free_ports

TOPIC = "orders"
PARTITIONS = 3


def _properties(path: Path, work: Path, proxy_port: int, node_base: int, security: dict[str, str],
                metadata_backend: str) -> None:
    path.write_text(
        f"""# tierproxy demo: one file for the pipeline and the proxy
remote.log.storage.backend=local
remote.log.storage.local.dir={work / "remote"}
remote.log.metadata.backend={metadata_backend}
remote.log.metadata.dir={work / "metadata"}
spark.master=local[2]
# Tier `orders`: 64 KiB remote segments, the newest shipped once it is 2 s old,
# and the broker keeps nothing that is safely remote.
topic.{TOPIC}.remote.storage.enable=true
topic.{TOPIC}.segment.bytes=65536
topic.{TOPIC}.segment.ms=2000
topic.{TOPIC}.local.retention.ms=0
topic.{TOPIC}.retention.ms=-1
# ...and keep an Iceberg table of it (kafka.{TOPIC}, a SQL catalog in SQLite beside the metadata).
topic.{TOPIC}.iceberg.enable=true
proxy.listener.host=127.0.0.1
proxy.bootstrap.port={proxy_port}
proxy.broker.port.base={node_base}
metrics.port=0
# The cluster, and how tierproxy reaches it
"""
    )
    with open(path, "a", encoding="utf-8") as f:
        javaproperties.dump(security, f, timestamp=False)


def _client(bootstrap: str, security: dict[str, str]) -> dict:
    """aiokafka keyword arguments for `bootstrap` with the demo's security."""
    return {"bootstrap_servers": bootstrap,
            **aiokafka_options(parse({**security, "bootstrap.servers": bootstrap}))}


async def _produce(client: dict, start: int, count: int) -> dict[tuple[int, int], bytes]:
    """`count` orders; returns {(partition, offset): key}."""
    producer = AIOKafkaProducer(**client, compression_type="lz4", linger_ms=10)
    await producer.start()
    try:
        futures = []
        for i in range(start, start + count):
            key = f"order-{i:07d}".encode()
            value = f'{{"order": {i}, "amount": {i % 997}.{i % 100:02d}, "currency": "EUR"}}'.encode()
            futures.append((key, await producer.send(TOPIC, key=key, value=value, partition=i % PARTITIONS)))
        produced = {}
        for key, future in futures:
            meta = await future
            produced[(meta.partition, meta.offset)] = key
        return produced
    finally:
        await producer.stop()


async def _consume(client: dict, expected: int) -> dict[tuple[int, int], bytes]:
    """Everything from offset 0 through the proxy: {(partition, offset): key}."""
    consumer = AIOKafkaConsumer(**client, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        consumed: dict[tuple[int, int], bytes] = {}
        deadline = time.monotonic() + 120
        while len(consumed) < expected and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=1000, max_records=5000)).values():
                for record in batch:
                    consumed[(record.partition, record.offset)] = record.key
        return consumed
    finally:
        await consumer.stop()


def _wait_for_port(host: str, port: int, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"tierproxy serve exited with {process.returncode}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"tierproxy serve did not listen on {host}:{port} within {timeout:.0f} s")


def _tierproxy(*args: str) -> list[str]:
    return [sys.executable, "-m", "tierproxy.cli", *args]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=30_000, help="orders produced before tiering")
    parser.add_argument("--keep", type=Path, default=None, help="keep the remote store and logs in DIR")
    parser.add_argument("--secure", action="store_true",
                        help="SASL_SSL and TLS everywhere, SCRAM logins, the metadata topic backend")
    args = parser.parse_args(argv)

    work = args.keep or Path(tempfile.mkdtemp(prefix="tierproxy-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    proxy: subprocess.Popen | None = None
    try:
        with KafkaCluster(1, workdir=work / "kafka", secure=args.secure) as kafka:
            print(f"[demo] Kafka {kafka.bootstrap_servers} (KRaft, testbed"
                  f"{', SASL_SSL' if args.secure else ''})", flush=True)
            # The broker must not delete tiered data on its own: retention.ms=-1.
            kafka.create_topic(TOPIC, partitions=PARTITIONS, config={"retention.ms": "-1"})
            proxy_port, node_base = free_ports(2)
            config = work / "tierproxy.properties"
            proxy_address = f"127.0.0.1:{proxy_port}"
            if args.secure:
                tierproxy = kafka.tierproxy_properties(mechanism="SCRAM-SHA-512")
                # The consumer logs in itself, through the proxy, with SCRAM-SHA-256.
                consumer = {**kafka.tierproxy_properties(mechanism="SCRAM-SHA-256"), "bootstrap.servers": proxy_address}
                _properties(config, work, proxy_port, node_base, {
                    **tierproxy, "proxy.ssl.certificate.location": str(kafka.tls.broker_cert),
                    "proxy.ssl.key.location": str(kafka.tls.broker_key)}, "topic")
            else:
                tierproxy = {"bootstrap.servers": kafka.bootstrap_servers}
                consumer = {"bootstrap.servers": proxy_address}
                _properties(config, work, proxy_port, node_base, tierproxy, "file")
            to_broker = _client(kafka.bootstrap_servers, tierproxy)

            produced = asyncio.run(_produce(to_broker, 0, args.records))
            print(f"[demo] produced {len(produced)} orders", flush=True)

            print("[demo] tierproxy tier (Spark local mode): copy to remote segments, then trim the broker",
                  flush=True)
            tier = subprocess.run(_tierproxy("tier", "--config", str(config)), env=env, cwd=work,
                                  stdout=sys.stdout, stderr=sys.stderr, timeout=600)
            if tier.returncode != 0:
                print(f"[demo] tierproxy tier failed with exit status {tier.returncode}", file=sys.stderr)
                return 1

            in_table = _table_counts(config)
            print(f"[demo] Iceberg table kafka.{TOPIC}, SELECT partition, count(*) GROUP BY partition: "
                  + ", ".join(f"{p}: {n}" for p, n in sorted(in_table.items())), flush=True)
            if not in_table:
                return 1

            more = asyncio.run(_produce(to_broker, args.records, args.records // 3))
            produced.update(more)
            print(f"[demo] produced {len(more)} more orders (these stay on the broker)", flush=True)

            log = open(work / "proxy.log", "w")
            proxy = subprocess.Popen(_tierproxy("serve", "--config", str(config)), env=env, cwd=work,
                                     stdout=log, stderr=subprocess.STDOUT)
            _wait_for_port("127.0.0.1", proxy_port, proxy)
            print(f"[demo] tierproxy serve on 127.0.0.1:{proxy_port}; consuming {TOPIC} from offset 0 through it",
                  flush=True)

            consumed = asyncio.run(_consume(_client(proxy_address, consumer), len(produced)))
            local_start = asyncio.run(_local_log_start(parse(tierproxy)))
            remote = sum(1 for (p, o) in consumed if o < local_start[p])
            broker = len(consumed) - remote
            exact = consumed == produced
            print(f"[demo] consumed {len(consumed)} records through the proxy: "
                  f"{remote} from the remote tier, {broker} from the broker", flush=True)
            print("[demo] local log start per partition (the broker no longer has what is below): "
                  + ", ".join(f"{TOPIC}-{p}: {o}" for p, o in sorted(local_start.items())), flush=True)
            print(f"[demo] every produced record exactly once: {'yes' if exact else 'NO'}", flush=True)
            # The proxy stops first, while the broker it reads metadata from is still up.
            _stop(proxy)
            if not exact or remote == 0 or broker == 0:
                return 1
            return 0
    finally:
        _stop(proxy)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"[demo] kept {work}", flush=True)


def _table_counts(path: Path) -> dict[int, int]:
    """Rows per partition of the topic's Iceberg table, read with pyiceberg."""
    from tierproxy.config import load
    from tierproxy.pipeline.iceberg.settings import load_catalog, table_settings

    config = load(path)
    table = load_catalog(config).load_table(table_settings(config, TOPIC).identifier)
    rows = table.scan(selected_fields=("partition",)).to_arrow().group_by("partition").aggregate([("partition", "count")])
    return dict(zip(rows.column("partition").to_pylist(), rows.column("partition_count").to_pylist()))


def _stop(proxy: subprocess.Popen | None) -> None:
    if proxy is not None and proxy.poll() is None:
        proxy.send_signal(signal.SIGTERM)
        try:
            proxy.wait(30)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()


async def _local_log_start(config: Config) -> dict[int, int]:
    from tierproxy.client.cluster import Cluster
    from tierproxy.protocol.apis import OffsetSpec

    async with Cluster.from_config(config) as cluster:
        topics = await cluster.topics([TOPIC])
        offsets = await cluster.list_offsets(topics, [(TOPIC, p) for p in range(PARTITIONS)], OffsetSpec.EARLIEST)
    return {p: offsets[(TOPIC, p)].offset for p in range(PARTITIONS)}


if __name__ == "__main__":
    sys.exit(main())
