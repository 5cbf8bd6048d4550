"""Real clients through the proxy against the real broker: aiokafka, confluent-kafka
(librdkafka), kcat and Kafka's Java console consumer read back exactly what was
produced (every codec, committed and aborted transactions), and consumer groups
commit and rebalance through it."""

from __future__ import annotations

import asyncio
import time
import uuid

from collections.abc import Iterator
from typing import Any

import pytest

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from tests.helpers.produce import ProducedRecord, produce_mixed, produce_values
from tests.helpers.consume import confluent_key, console_consumer_read_committed, consume_aiokafka, consume_confluent
from tests.helpers.consume import expected_keys, kcat_read_committed, printed_keys, record_key
from tests.helpers.proxy import ProxyThread, running_proxy

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
    # kcat prints one line per record: partition, offset, key; values are checked above.
    committed = printed_keys(r for r in produced if r.committed)
    assert kcat_read_committed(proxy.bootstrap_servers, topic, timeout=60) == committed


def test_java_console_consumer_reads_every_committed_record(kafka_cluster, proxy, mixed_topic):
    topic, produced = mixed_topic
    committed = printed_keys(r for r in produced if r.committed)
    assert console_consumer_read_committed(kafka_cluster, proxy.bootstrap_servers, topic, len(committed),
                                           timeout=90) == committed


async def test_consumer_group_commits_and_rebalances_through_the_proxy(kafka_cluster, proxy):
    topic = f"groups-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, partitions=4)
    try:
        await produce_values(proxy.bootstrap_servers, topic, 40, 4)
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


