"""Real clients through the proxy against the real broker: aiokafka, confluent-kafka
(librdkafka), kcat and Kafka's Java console consumer read back exactly what was
produced (every codec, committed and aborted transactions), and consumer groups
commit and rebalance through it."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid

from collections.abc import Iterator
from typing import Any

import pytest

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from tests.helpers.produce import ProducedRecord, produce_mixed
from tests.proxy.test_passthrough import (
    ProxyThread,
    confluent_key,
    consume_aiokafka,
    consume_confluent,
    expected_keys,
    record_key,
    running_proxy,
)

PARTITIONS = 3


@pytest.fixture(scope="module")
def proxy(kafka_cluster) -> Iterator[ProxyThread]:
    with running_proxy(kafka_cluster.bootstrap_servers, nodes=1) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def mixed_topic(kafka_cluster, proxy) -> Iterator[tuple[str, list[ProducedRecord]]]:
    """3 partitions of every codec plus a committed and an aborted transaction, all
    produced through the proxy (aiokafka and librdkafka's transactional producer)."""
    name = f"passthrough-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(name, partitions=PARTITIONS)
    produced = asyncio.run(produce_mixed(proxy.bootstrap_servers, name, PARTITIONS, per_codec=100,
                                         per_transaction=40))
    yield name, produced
    kafka_cluster.delete_topic(name)


async def test_aiokafka_reads_what_was_produced_through_the_proxy(proxy, mixed_topic):
    topic, produced = mixed_topic
    committed = expected_keys(produced, read_committed=True)
    records = await consume_aiokafka(proxy.bootstrap_servers, topic, len(committed),
                                     isolation_level="read_committed")
    got = sorted(record_key(r) for r in records)
    assert got == committed
    # Headers arrived too (librdkafka's delivery reports do not return the headers it
    # sent, so only aiokafka's records know theirs).
    by_offset = {(r.partition, r.offset): r for r in produced if r.source.startswith("aiokafka")}
    checked = 0
    for record in records:
        if (record.partition, record.offset) in by_offset:
            assert tuple(record.headers) == by_offset[(record.partition, record.offset)].headers
            checked += 1
    assert checked == len(by_offset)


def test_confluent_kafka_read_uncommitted_sees_aborted_records(proxy, mixed_topic):
    topic, produced = mixed_topic
    everything = expected_keys(produced)
    messages = consume_confluent(proxy.bootstrap_servers, topic, len(everything),
                                 **{"isolation.level": "read_uncommitted"})
    assert sorted(confluent_key(m) for m in messages) == everything


def test_kcat_reads_every_committed_record(proxy, mixed_topic):
    topic, produced = mixed_topic
    committed = expected_keys(produced, read_committed=True)
    # kcat prints one line per record: partition, offset, key; values are checked above.
    result = subprocess.run(
        ["kcat", "-b", proxy.bootstrap_servers, "-C", "-t", topic, "-o", "beginning", "-e", "-q",
         "-X", "isolation.level=read_committed", "-f", "%p %o %k\\n"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = sorted(tuple(line.split(" ")) for line in result.stdout.splitlines() if line)
    assert lines == sorted((str(p), str(o), k.decode()) for p, o, k, _ in committed)


def test_java_console_consumer_reads_every_committed_record(kafka_cluster, proxy, mixed_topic):
    topic, produced = mixed_topic
    committed = expected_keys(produced, read_committed=True)
    result = kafka_cluster.java_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server", proxy.bootstrap_servers, "--topic", topic, "--from-beginning",
        "--max-messages", str(len(committed)), "--timeout-ms", "30000",
        "--isolation-level", "read_committed",
        "--property", "print.key=true", "--property", "print.value=false",
        "--property", "print.partition=true", "--property", "print.offset=true",
        timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    got = sorted(_console_line(line) for line in result.stdout.splitlines() if line.startswith("Partition:"))
    assert got == sorted((p, o, k.decode()) for p, o, k, _ in committed)


def _console_line(line: str) -> tuple[int, int, str]:
    # "Partition:1\tOffset:42\taiokafka-none-7"
    partition, offset, key = line.split("\t")[:3]
    return int(partition.split(":")[1]), int(offset.split(":")[1]), key


async def test_consumer_group_commits_and_rebalances_through_the_proxy(kafka_cluster, proxy):
    topic = f"groups-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, partitions=4)
    try:
        producer = AIOKafkaProducer(bootstrap_servers=proxy.bootstrap_servers)
        await producer.start()
        try:
            for i in range(40):
                await producer.send(topic, value=b"v%d" % i, partition=i % 4)
            await producer.flush()
        finally:
            await producer.stop()
        group = f"group-{uuid.uuid4().hex[:8]}"
        common = dict(bootstrap_servers=proxy.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
                      enable_auto_commit=False, session_timeout_ms=10000, heartbeat_interval_ms=500)
        first = AIOKafkaConsumer(topic, **common)
        await first.start()
        try:
            await _wait_for(lambda: len(first.assignment()) == 4, first)
            seen = await _drain(first, 40)
            assert sorted(r.value for r in seen) == sorted(b"v%d" % i for i in range(40))
            await first.commit()
            second = AIOKafkaConsumer(topic, **common)
            await second.start()
            try:
                # The rebalance hands part of the partitions to the second member.
                await _wait_for(lambda: len(first.assignment()) + len(second.assignment()) == 4
                                and len(second.assignment()) > 0, first, second)
                committed = {tp.partition: await second.committed(tp) for tp in
                             (TopicPartition(topic, p) for p in range(4))}
                assert committed == {p: 10 for p in range(4)}
            finally:
                await second.stop()
        finally:
            await first.stop()
    finally:
        kafka_cluster.delete_topic(topic)


async def _drain(consumer: AIOKafkaConsumer, count: int) -> list[Any]:
    records: list[Any] = []
    deadline = time.monotonic() + 30
    while len(records) < count and time.monotonic() < deadline:
        for batch in (await consumer.getmany(timeout_ms=500)).values():
            records.extend(batch)
    return records


async def _wait_for(condition: Any, *consumers: AIOKafkaConsumer, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "consumer group did not settle"
        for consumer in consumers:  # polling drives the group protocol
            await consumer.getmany(timeout_ms=100)


