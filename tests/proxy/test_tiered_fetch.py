"""Consumers read from offset 0 through the proxy after the broker's log was trimmed:
the old part comes from the remote tier, the rest from the broker, and every client
sees every record exactly once, in order. READ_COMMITTED hides aborted records on
both sides of the remote/local boundary, including a transaction split by it."""

from __future__ import annotations

import asyncio
import time
import pytest

from tierproxy.client.connection import KafkaConnection
from tests.helpers.consume import confluent_key, console_consumer_read_committed, consume_aiokafka, consume_confluent
from tests.helpers.consume import expected_keys, kcat_read_committed, printed_keys, record_key
from tests.helpers.fixtures import proxy_fixture, tiered_fixture
from tests.helpers.proxy import ProxyThread
from tests.helpers.tiered import Mixed, TieredTopic, TopicSpec

PARTITIONS = 3
# The first ~60% of each partition remote only, the broker trimmed; partition 0's boundary
# falls between the two batches of an aborted transaction.
SPEC = TopicSpec(Mixed(per_codec=1500, per_transaction=150, split_abort=True, then_per_codec=300),
                 partitions=PARTITIONS, segment_bytes=48 * 1024)
pytestmark = pytest.mark.timeout(300)


tiered = tiered_fixture(SPEC)
proxy = proxy_fixture(**{"remote.log.chunk.size.bytes": 64 * 1024})


def test_the_broker_no_longer_has_the_remote_part(kafka_cluster, tiered):
    local = [r for r in tiered.records if r.offset >= tiered.boundary[r.partition]]
    consumed = asyncio.run(consume_aiokafka(kafka_cluster.bootstrap_servers, tiered.topic, len(local),
                                            isolation_level="read_uncommitted"))
    # Straight from the broker, the consumer resets to the local log start: only the local part.
    assert sorted(record_key(r) for r in consumed) == sorted(expected_keys(local))


async def test_aiokafka_reads_everything_through_the_proxy(proxy, tiered):
    consumed = await consume_aiokafka(proxy.bootstrap_servers, tiered.topic, len(tiered.records),
                                      isolation_level="read_uncommitted")
    assert [record_key(r) for r in sorted(consumed, key=lambda r: (r.partition, r.offset))] == expected_keys(
        tiered.records)
    by_key = {(r.partition, r.offset): r for r in tiered.records}
    for record in consumed:
        produced = by_key[(record.partition, record.offset)]
        assert tuple(record.headers) == produced.headers and record.timestamp == produced.timestamp_ms
    served = proxy.metrics.value("tierproxy_remote_partitions_served_total", {"topic": tiered.topic})
    assert served > 0


async def test_aiokafka_read_committed_hides_aborted_on_both_sides(proxy, tiered):
    consumed = await consume_aiokafka(proxy.bootstrap_servers, tiered.topic,
                                      len(expected_keys(tiered.records, read_committed=True)),
                                      isolation_level="read_committed")
    got = [record_key(r) for r in sorted(consumed, key=lambda r: (r.partition, r.offset))]
    assert got == expected_keys(tiered.records, read_committed=True)
    assert not any(r.key.startswith(b"split-") for r in consumed)


def test_confluent_kafka_both_isolation_levels(proxy, tiered):
    for isolation, committed_only in (("read_uncommitted", False), ("read_committed", True)):
        expected = expected_keys(tiered.records, read_committed=committed_only)
        messages = consume_confluent(proxy.bootstrap_servers, tiered.topic, len(expected),
                                     **{"isolation.level": isolation})
        assert sorted(confluent_key(m) for m in messages) == expected, isolation


def test_kcat_reads_every_committed_record(proxy, tiered):
    committed = printed_keys(r for r in tiered.records if r.committed)
    assert kcat_read_committed(proxy.bootstrap_servers, tiered.topic, timeout=120) == committed


def test_java_console_consumer_reads_every_committed_record(kafka_cluster, proxy, tiered):
    committed = printed_keys(r for r in tiered.records if r.committed)
    assert console_consumer_read_committed(kafka_cluster, proxy.bootstrap_servers, tiered.topic, len(committed),
                                           timeout=120) == committed


async def _timed_fetches(proxy: ProxyThread, tiered: TieredTopic, count: int, *, max_wait_ms: int,
                         min_bytes: int) -> list[tuple[float, int]]:
    """Fetch partition 0 from offset 0 (remote) and partition 1 at its end (nothing new)
    `count` times in a row: (seconds, remote bytes answered) of each."""
    import dataclasses

    from tierproxy.protocol.apis import OffsetSpec
    from tierproxy.protocol.requests import fetch_request, list_offsets_request

    host, port = proxy.bootstrap_servers.rsplit(":", 1)
    async with await KafkaConnection.open(host, int(port)) as conn:
        ends = await conn.request(list_offsets_request({tiered.topic: [1]}, OffsetSpec.LATEST))
        end = ends.topics[0].partitions[0].offset
        request = fetch_request(tiered.topic, 0, 0, 1 << 20, max_wait_ms=max_wait_ms, min_bytes=min_bytes)
        topic = request.topics[0]
        at_end = dataclasses.replace(topic.partitions[0], partition=type(topic.partitions[0].partition)(1),
                                     fetch_offset=end)
        request = dataclasses.replace(request, topics=(dataclasses.replace(
            topic, partitions=(topic.partitions[0], at_end)),))
        out = []
        for _ in range(count):
            started = time.monotonic()
            response = await conn.request(request, timeout=max_wait_ms / 1000 + 30)
            elapsed = time.monotonic() - started
            partitions = {p.partition_index: p for p in response.responses[0].partitions}
            assert partitions[0].error_code == 0 and partitions[1].error_code == 0, partitions
            assert not partitions[1].records
            out.append((elapsed, len(partitions[0].records or b"")))
    return out


async def test_remote_bytes_reaching_min_bytes_answer_without_the_brokers_wait(proxy, tiered):
    # A wait of 20 s would be unmistakable; Kafka answers as soon as min_bytes are there.
    fetches = await _timed_fetches(proxy, tiered, 4, max_wait_ms=20_000, min_bytes=1)
    assert all(size > 0 for _, size in fetches), fetches
    assert max(elapsed for elapsed, _ in fetches) < 10, fetches


async def test_fewer_bytes_than_min_bytes_wait_for_max_wait(proxy, tiered):
    # The first fetch proves partition 0 remote; the second reads it without the broker,
    # and its remote bytes are far below min_bytes: the broker is asked to wait the rest.
    fetches = await _timed_fetches(proxy, tiered, 2, max_wait_ms=1500, min_bytes=50 << 20)
    (_, first_size), (second_wait, second_size) = fetches
    assert first_size > 0 and second_size > 0, fetches
    assert second_wait >= 1.2, fetches


async def test_local_records_filling_every_response_do_not_starve_a_remote_partition(proxy, tiered):
    """Partition 1 has local records for every Fetch, and they fill max_bytes; partition 0
    is remote. Kafka's fetch sessions move partitions that got data to the back; here the
    remote partition left without bytes gets one whole batch (KIP-74) in the next Fetch."""
    import dataclasses

    from tierproxy.protocol.records import iter_batches
    from tierproxy.protocol.requests import fetch_request

    host, port = proxy.bootstrap_servers.rsplit(":", 1)
    async with await KafkaConnection.open(host, int(port)) as conn:
        request = fetch_request(tiered.topic, 0, 0, 1024, max_wait_ms=100)
        topic = request.topics[0]
        remote = topic.partitions[0]
        local = dataclasses.replace(remote, partition=type(remote.partition)(1),
                                    fetch_offset=type(remote.fetch_offset)(tiered.boundary[1]))
        remote_served = []
        for _ in range(6):
            response = await conn.request(dataclasses.replace(
                request, topics=(dataclasses.replace(topic, partitions=(remote, local)),)))
            partitions = {p.partition_index: p for p in response.responses[0].partitions}
            assert partitions[0].error_code == 0 and partitions[1].error_code == 0, partitions
            local_batches = list(iter_batches(partitions[1].records or b""))
            assert local_batches, "partition 1 ran out of local records: the premise does not hold"
            remote_served.append(len(partitions[0].records or b""))
            local = dataclasses.replace(local, fetch_offset=type(local.fetch_offset)(local_batches[-1].last_offset + 1))
            if remote_served[-1]:
                remote_batches = list(iter_batches(partitions[0].records))
                remote = dataclasses.replace(
                    remote, fetch_offset=type(remote.fetch_offset)(remote_batches[-1].last_offset + 1))
    # Starved at most once in a row.
    assert not any(a == 0 and b == 0 for a, b in zip(remote_served, remote_served[1:])), remote_served
