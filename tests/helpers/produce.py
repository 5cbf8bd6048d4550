"""Produces known data sets to the real broker and remembers every record.

A mixed one: every compression codec through aiokafka, and transactions through
confluent-kafka (librdkafka), one that commits and one that aborts. A timed one: records
with explicit, growing CREATE_TIME timestamps. Tests compare what they read back, through
any path, with the returned records.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from confluent_kafka import Producer

CODECS = (None, "gzip", "snappy", "lz4", "zstd")


@dataclass(frozen=True, slots=True)
class ProducedRecord:
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int
    committed: bool  # False for records of an aborted transaction
    source: str


async def produce_codecs(
    bootstrap: str, topic: str, partitions: int, per_codec: int, *, value_size: int = 100
) -> list[ProducedRecord]:
    """`per_codec` records for each compression codec, spread over the partitions."""
    produced: list[ProducedRecord] = []
    for codec in CODECS:
        source = f"aiokafka-{codec or 'none'}"
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, compression_type=codec, linger_ms=5, max_batch_size=64 * 1024
        )
        await producer.start()
        try:
            pending = []
            for i in range(per_codec):
                partition = i % partitions
                key = f"{source}-{i}".encode()
                value = _value(key, value_size)
                headers = [("codec", (codec or "none").encode()), ("seq", str(i).encode())]
                timestamp_ms = _now_ms() + i
                future = await producer.send(
                    topic, value=value, key=key, partition=partition, headers=headers, timestamp_ms=timestamp_ms
                )
                pending.append((future, key, value, tuple(headers), timestamp_ms))
            for future, key, value, headers, timestamp_ms in pending:
                meta = await future
                produced.append(
                    ProducedRecord(meta.partition, meta.offset, key, value, headers, timestamp_ms, True, source)
                )
        finally:
            await producer.stop()
    return produced


async def produce_values(bootstrap: str, topic: str, count: int, partitions: int, **options: Any) -> None:
    """Records b"v0", b"v1", ... round-robin over the partitions (aiokafka, `options` for its producer)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **options)
    await producer.start()
    try:
        for i in range(count):
            await producer.send(topic, value=b"v%d" % i, partition=i % partitions)
        await producer.flush()
    finally:
        await producer.stop()


def produce_transactions(
    bootstrap: str, topic: str, partitions: int, per_transaction: int, *, value_size: int = 100
) -> list[ProducedRecord]:
    """One committed and one aborted transaction, each over every partition (librdkafka)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"tierproxy-test-{topic}",
            "compression.type": "lz4",
            "linger.ms": 5,
        }
    )
    producer.init_transactions(30)
    produced: list[ProducedRecord] = []
    for outcome in ("commit", "abort"):
        source = f"librdkafka-txn-{outcome}"
        delivered: list[ProducedRecord] = []

        def on_delivery(err, msg, _source=source, _outcome=outcome):
            if err is not None:
                raise RuntimeError(f"delivery failed: {err}")
            delivered.append(
                ProducedRecord(
                    # Delivery reports carry no headers: record the ones sent.
                    msg.partition(), msg.offset(), msg.key(), msg.value(), (("txn", _outcome.encode()),),
                    msg.timestamp()[1], _outcome == "commit", _source,
                )
            )

        producer.begin_transaction()
        for i in range(per_transaction):
            key = f"{source}-{i}".encode()
            producer.produce(
                topic, key=key, value=_value(key, value_size), partition=i % partitions,
                headers=[("txn", outcome.encode())], timestamp=_now_ms() + i, on_delivery=on_delivery,
            )
        producer.flush(30)
        if outcome == "commit":
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
        producer.flush(30)
        produced.extend(delivered)
    return produced


def produce_timed(
    client_config: dict[str, Any],
    topic: str,
    partitions: int,
    per_partition: int,
    *,
    value_size: int = 200,
    base_timestamp_ms: int | None = None,
    step_ms: int = 10,
    timestamps: dict[tuple[int, int], int] | None = None,
    compression: str = "none",
) -> list[ProducedRecord]:
    """`per_partition` records per partition (librdkafka), with explicit CREATE_TIME
    timestamps `base + step * i`, increasing in every partition. `timestamps` overrides the
    timestamp of (partition, i), the i-th record produced to that partition. Uncompressed
    unless `compression` names a codec."""
    base = _now_ms() if base_timestamp_ms is None else base_timestamp_ms
    # Idempotent: offsets follow the order of produce() calls, so timestamps grow with offsets.
    producer = Producer({**client_config, "linger.ms": 5, "compression.type": compression, "batch.size": 16384,
                         "enable.idempotence": True})
    produced: list[ProducedRecord] = []
    failures: list[Any] = []

    def delivered(err: Any, msg: Any, _timestamp: int) -> None:
        if err is not None:
            failures.append(err)
            return
        produced.append(ProducedRecord(msg.partition(), msg.offset(), msg.key(), msg.value(), (), _timestamp, True,
                                       "librdkafka"))

    for i in range(per_partition):
        for partition in range(partitions):
            key = f"{topic}-{partition}-{i}".encode()
            timestamp = (timestamps or {}).get((partition, i), base + step_ms * i)
            producer.produce(topic, key=key, value=_value(key, value_size), partition=partition, timestamp=timestamp,
                             on_delivery=lambda err, msg, _t=timestamp: delivered(err, msg, _t))
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures[:3]
    return sorted(produced, key=lambda r: (r.partition, r.offset))


async def produce_mixed(
    bootstrap: str, topic: str, partitions: int, *, per_codec: int = 200, per_transaction: int = 60
) -> list[ProducedRecord]:
    records = await produce_codecs(bootstrap, topic, partitions, per_codec)
    records += await asyncio.to_thread(produce_transactions, bootstrap, topic, partitions, per_transaction)
    await wait_for_markers(bootstrap, topic, partitions)
    return sorted(records, key=lambda r: (r.partition, r.offset))


def produce_split_abort(bootstrap: str, topic: str, per_half: int = 5) -> list[ProducedRecord]:
    """An aborted transaction on partition 0 in two batches (flushed apart), so that a cut
    (the remote/local boundary) can fall between them."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"split-{topic}", "linger.ms": 0})
    producer.init_transactions(30)
    producer.begin_transaction()
    records: list[ProducedRecord] = []

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        records.append(ProducedRecord(0, msg.offset(), msg.key(), msg.value(), (), msg.timestamp()[1], False,
                                      "split-abort"))

    for half in range(2):
        for i in range(per_half):
            key = f"split-{half}-{i}".encode()
            producer.produce(topic, key=key, value=key * 3, partition=0, on_delivery=delivered)
        producer.flush(30)
    producer.abort_transaction(30)
    return records


async def wait_for_markers(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> None:
    """Until every partition's last stable offset reached its end: a producer's
    commit/abort returns before the coordinator has written the markers."""
    from tierproxy.client.cluster import READ_COMMITTED, Cluster
    from tierproxy.protocol.apis import OffsetSpec

    deadline = time.monotonic() + timeout
    async with Cluster(bootstrap.split(",")) as cluster:
        topics = await cluster.topics([topic])
        tps = [(topic, p) for p in range(partitions)]
        while True:
            end = await cluster.list_offsets(topics, tps, OffsetSpec.LATEST)
            stable = await cluster.list_offsets(topics, tps, OffsetSpec.LATEST, isolation_level=READ_COMMITTED)
            if all(stable[tp].offset == end[tp].offset for tp in tps):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"transaction markers of {topic} not written within {timeout} s")
            await asyncio.sleep(0.1)


async def until_older(records: list[ProducedRecord], age_ms: int) -> None:
    """Until the newest record is `age_ms` old by its timestamp: the codec producers stamp
    records ahead of the clock, and a time-based rule (retention, segment.ms) spares what is
    not yet old enough."""
    newest_ms = max(r.timestamp_ms for r in records)
    await asyncio.sleep(max(0.0, (newest_ms + age_ms) / 1000 - time.time()))


def _value(key: bytes, size: int) -> bytes:
    # Repetitive enough to compress, distinct per record.
    return (key + b"|") * (size // (len(key) + 1)) + key[: size % (len(key) + 1)]


def _now_ms() -> int:
    # Current timestamps: records far in the past make the broker roll a segment on
    # every append (segment.ms is measured from the first batch's timestamp).
    return int(time.time() * 1000)
