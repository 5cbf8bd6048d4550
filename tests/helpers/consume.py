"""Consumers of the tests (aiokafka, librdkafka) and the keys tests compare records by:
(partition, offset, key, value), of a consumed record or of a ProducedRecord."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer
from confluent_kafka import Consumer, KafkaError, TopicPartition

from testbed.kafka import KafkaCluster
from tests.helpers.produce import ProducedRecord


def record_key(record: Any) -> tuple:
    """What a consumed record (aiokafka) must equal of its ProducedRecord."""
    return (record.partition, record.offset, record.key, record.value)


def record_keys(records: Iterable[Any]) -> list[tuple]:
    """`record_key` of aiokafka records or ProducedRecords, as consumed (no sorting)."""
    return [record_key(r) for r in records]


def confluent_key(message: Any) -> tuple:
    """`record_key` of a librdkafka message."""
    return (message.partition(), message.offset(), message.key(), message.value())


def expected_keys(produced: list[ProducedRecord], *, read_committed: bool = False) -> list[tuple]:
    return [record_key(r) for r in produced if r.committed or not read_committed]


def in_partition_order(consumed: list[tuple]) -> dict[int, list[tuple]]:
    """Consumed (partition, offset, key, value) tuples per partition, in the order they arrived."""
    out: dict[int, list[tuple]] = {}
    for item in consumed:
        out.setdefault(item[0], []).append(item)
    return out


def expected_by_partition(records: Iterable[ProducedRecord]) -> dict[int, list[tuple]]:
    """What a consumer must read of each partition: every record, in offset order."""
    return in_partition_order(record_keys(sorted(records, key=lambda r: (r.partition, r.offset))))


async def consume_aiokafka(bootstrap: str, topic: str, count: int, **kwargs: Any) -> list[Any]:
    """aiokafka subscribed from the earliest offset, until `count` records or 60 s."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, **kwargs)
    await consumer.start()
    records: list[Any] = []
    try:
        deadline = time.monotonic() + 60
        while len(records) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for batch in batches.values():
                records.extend(batch)
    finally:
        await consumer.stop()
    return records


def _drain(consumer: Consumer, count: int, timeout_s: float, *, poll_s: float, errors: list[KafkaError] | None = None,
           stop: Any = None) -> list[Any]:
    """Messages until `count`, `timeout_s` or `stop` is set; per-partition errors go to
    `errors` (the consumer keeps fetching). Closes the consumer."""
    messages: list[Any] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(messages) < count and time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            for message in consumer.consume(500, timeout=poll_s):
                if message.error() is None:
                    messages.append(message)
                elif errors is not None:
                    errors.append(message.error())
    finally:
        consumer.close()
    return messages


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def consume_confluent(bootstrap: str, topic: str, count: int, **config: Any) -> list[Any]:
    """librdkafka subscribed (a group of its own) from the earliest offset, until `count` messages or 60 s."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": _group(), "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, **config})
    consumer.subscribe([topic])
    return _drain(consumer, count, 60, poll_s=0.5)


def consume_confluent_assigned(
    client_config: dict[str, Any], topic: str, partitions: Iterable[int], count: int, *, timeout_s: float = 60.0,
    errors: list[KafkaError] | None = None, stop: Any = None,
) -> list[tuple]:
    """librdkafka reading `partitions` from offset 0 (no group), in arrival order.
    Per-partition errors the consumer reports go to `errors` (it keeps fetching)."""
    consumer = Consumer({**client_config, "group.id": _group(), "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "fetch.error.backoff.ms": 100})
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    return [confluent_key(m) for m in _drain(consumer, count, timeout_s, poll_s=0.2, errors=errors, stop=stop)]


def printed_keys(records: Iterable[ProducedRecord]) -> list[tuple[int, int, str]]:
    """(partition, offset, key as text) of the records, sorted: what the command-line
    consumers below print of them."""
    return sorted((r.partition, r.offset, r.key.decode()) for r in records)


def kcat_read_committed(bootstrap: str, topic: str, *, timeout: float) -> list[tuple[int, int, str]]:
    """kcat reading the topic from the beginning to its end, read_committed: (partition,
    offset, key) of each record, sorted."""
    result = subprocess.run(
        ["kcat", "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q",
         "-X", "isolation.level=read_committed", "-f", "%p %o %k\\n"],
        capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return sorted((int(p), int(o), k) for p, o, k in (line.split(" ") for line in result.stdout.splitlines() if line))


def console_consumer_read_committed(cluster: KafkaCluster, bootstrap: str, topic: str, count: int, *,
                                    timeout: float) -> list[tuple[int, int, str]]:
    """Kafka's Java console consumer reading `count` records from the beginning,
    read_committed: (partition, offset, key) of each, sorted."""
    result = cluster.java_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server", bootstrap, "--topic", topic, "--from-beginning",
        "--max-messages", str(count), "--timeout-ms", "30000",
        "--isolation-level", "read_committed",
        "--property", "print.key=true", "--property", "print.value=false",
        "--property", "print.partition=true", "--property", "print.offset=true",
        timeout=timeout)
    assert result.returncode == 0, result.stderr[-2000:]
    got = []
    for line in result.stdout.splitlines():
        if line.startswith("Partition:"):  # "Partition:1\tOffset:42\taiokafka-none-7"
            partition, offset, key = line.split("\t")[:3]
            got.append((int(partition.split(":")[1]), int(offset.split(":")[1]), key))
    return sorted(got)
