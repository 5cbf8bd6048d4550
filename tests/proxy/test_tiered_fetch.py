"""Consumers read from offset 0 through the proxy after the broker's log was trimmed:
the old part comes from the remote tier, the rest from the broker, and every client
sees every record exactly once, in order. READ_COMMITTED hides aborted records on
both sides of the remote/local boundary, including a transaction split by it."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tierproxy.client.cluster import Cluster
from tierproxy.protocol.records import iter_batches
from tierproxy.client.connection import KafkaConnection
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tierproxy.storage.model import TopicIdPartition
from tests.helpers.produce import ProducedRecord, produce_codecs, produce_mixed, wait_for_markers
from tests.proxy.tiered_helpers import local_proxy_settings
from tests.helpers.remote_tier import fetch_raw_log, latest_offset, tier_log, topic_id_of
from tests.proxy.test_passthrough import (
    ProxyThread,
    confluent_key,
    consume_aiokafka,
    consume_confluent,
    expected_keys,
    running_proxy,
    record_key,
)

PARTITIONS = 3
pytestmark = pytest.mark.timeout(300)


class Tiered:
    def __init__(self, topic: str, records: list[ProducedRecord], boundary: dict[int, int], root: Path) -> None:
        self.topic = topic
        self.records = records
        self.boundary = boundary  # partition -> the broker's new local log start
        self.root = root


def _split_aborted_transaction(bootstrap: str, topic: str) -> list[ProducedRecord]:
    """An aborted transaction on partition 0 in two batches (flushed apart), so that the
    remote/local boundary can fall between them."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"split-{topic}", "linger.ms": 0})
    producer.init_transactions(30)
    producer.begin_transaction()
    records: list[ProducedRecord] = []

    def delivered(err, msg):
        assert err is None, err
        records.append(ProducedRecord(0, msg.offset(), msg.key(), msg.value(), (), msg.timestamp()[1], False,
                                      "split-abort"))

    for half in range(2):
        for i in range(5):
            key = f"split-{half}-{i}".encode()
            producer.produce(topic, key=key, value=key * 3, partition=0, on_delivery=delivered)
        producer.flush(30)
    producer.abort_transaction(30)
    return records


@pytest.fixture(scope="module")
def tiered(kafka_cluster, tmp_path_factory) -> Iterator[Tiered]:
    """A topic whose first ~60% (per partition) is remote only, the broker trimmed."""
    topic = f"tiered-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, partitions=PARTITIONS)
    bootstrap = kafka_cluster.bootstrap_servers
    root = tmp_path_factory.mktemp("remote")

    async def build() -> Tiered:
        records = await produce_mixed(bootstrap, topic, PARTITIONS, per_codec=1500, per_transaction=150)
        split = await asyncio.to_thread(_split_aborted_transaction, bootstrap, topic)
        records += split
        records += await produce_codecs(bootstrap, topic, PARTITIONS, 300)
        await wait_for_markers(bootstrap, topic, PARTITIONS)
        records.sort(key=lambda r: (r.partition, r.offset))
        host, port = kafka_cluster.brokers[0][1:]
        boundary = {}
        async with await KafkaConnection.open(host, port) as conn:
            topic_id = await topic_id_of(conn, topic)
            rsm = LocalRemoteStorageManager(root / "remote")
            rlmm = FileRemoteLogMetadataManager(root / "metadata")
            await rlmm.start()
            try:
                for partition in range(PARTITIONS):
                    end = await latest_offset(conn, topic, partition)
                    log = await fetch_raw_log(conn, topic, partition, 0, end)
                    batches = list(iter_batches(log))
                    if partition == 0:
                        # Between the two halves of the split aborted transaction.
                        second_half = sorted(r.offset for r in split)[5]
                        cut = next(b for b in batches if b.base_offset >= second_half)
                    else:
                        cut = next(b for b in batches if b.base_offset >= end * 6 // 10)
                    boundary[partition] = cut.base_offset
                    await tier_log(log[: cut.position], TopicIdPartition(topic_id, topic, partition), rsm=rsm,
                                   rlmm=rlmm, work_dir=root / "work", segment_bytes=48 * 1024)
            finally:
                await rlmm.close()
                await rsm.close()
        async with Cluster([bootstrap]) as cluster:
            topics = await cluster.topics([topic])
            trimmed = await cluster.delete_records(topics, {(topic, p): o for p, o in boundary.items()})
            assert trimmed == {(topic, p): o for p, o in boundary.items()}
        return Tiered(topic, records, boundary, root)

    yield asyncio.run(build())
    kafka_cluster.delete_topic(topic)


@pytest.fixture(scope="module")
def proxy(kafka_cluster, tiered) -> Iterator[ProxyThread]:
    with running_proxy(kafka_cluster.bootstrap_servers, nodes=1, **local_proxy_settings(tiered.root),
                       **{"remote.log.chunk.size.bytes": 64 * 1024}) as proxy:
        yield proxy


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
    committed = expected_keys(tiered.records, read_committed=True)
    result = subprocess.run(
        ["kcat", "-b", proxy.bootstrap_servers, "-C", "-t", tiered.topic, "-o", "beginning", "-e", "-q",
         "-X", "isolation.level=read_committed", "-f", "%p %o %k\\n"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = sorted((int(p), int(o), k) for p, o, k in (line.split(" ") for line in result.stdout.splitlines() if line))
    assert lines == sorted((p, o, k.decode()) for p, o, k, _ in committed)


def test_java_console_consumer_reads_every_committed_record(kafka_cluster, proxy, tiered):
    committed = expected_keys(tiered.records, read_committed=True)
    result = kafka_cluster.java_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server", proxy.bootstrap_servers, "--topic", tiered.topic, "--from-beginning",
        "--max-messages", str(len(committed)), "--timeout-ms", "30000",
        "--isolation-level", "read_committed",
        "--property", "print.key=true", "--property", "print.value=false",
        "--property", "print.partition=true", "--property", "print.offset=true",
        timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    got = []
    for line in result.stdout.splitlines():
        if line.startswith("Partition:"):
            partition, offset, key = line.split("\t")[:3]
            got.append((int(partition.split(":")[1]), int(offset.split(":")[1]), key))
    assert sorted(got) == sorted((p, o, k.decode()) for p, o, k, _ in committed)


async def _timed_fetches(proxy: ProxyThread, tiered: Tiered, count: int, *, max_wait_ms: int,
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
