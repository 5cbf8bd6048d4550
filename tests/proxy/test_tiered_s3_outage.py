"""The remote tier in S3 (moto's server over HTTP), and an outage of it.

Partitions 0 and 1 of the topic are 60% remote only; partition 2 is entirely local.
While S3 is down, reads of the remote partitions get TIERED_STORAGE_NOT_AVAILABLE
(sent as UNKNOWN_SERVER_ERROR -1, which aiokafka and librdkafka both retry) and the
local partition keeps flowing to the very same consumers. moto forgets everything when
it restarts, so the test uploads the same segments again; the consumers then finish
with every record exactly once and in order.

The module runs its own S3 server: it stops it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import KafkaError

from testbed.s3 import S3Server
from tests.helpers.consume import consume_aiokafka, consume_confluent_assigned, expected_by_partition
from tests.helpers.consume import in_partition_order, record_keys
from tests.helpers.fixtures import proxy_fixture, tiered_fixture
from tests.helpers.proxy import ProxyThread
from tests.helpers.tiered import Timed, TopicSpec, upload_again
from tests.helpers.wait import wait_until

PARTITIONS = 3
PER_PARTITION = 1500
TIERED = (0, 1)
LOCAL_ONLY = 2
SPEC = TopicSpec(Timed(PER_PARTITION), partitions=PARTITIONS, tier=TIERED, store="s3")
pytestmark = [pytest.mark.timeout(240), pytest.mark.s3]


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server(bucket="tierproxy-outage") as server:
        yield server


tiered = tiered_fixture(SPEC, s3="s3", own=True)  # the module stops its S3 server
proxy = proxy_fixture(**{
    # An outage must show fast: two attempts with small backoffs, short requests.
    "remote.log.manager.task.retry.backoff.ms": 50,
    "remote.log.manager.task.retry.backoff.max.ms": 200,
    "remote.log.storage.s3.max.attempts": 2,
    "remote.log.storage.s3.request.timeout.ms": 2000,
    # Small chunks and a small chunk cache: the remote part cannot hide in memory.
    "remote.log.chunk.size.bytes": 16 * 1024,
    "remote.log.chunk.cache.size.bytes": 64 * 1024,
    "remote.log.read.ahead.chunks": 1,
})


def _not_available(proxy: ProxyThread, topic: str) -> float:
    """tierproxy_tiered_storage_not_available_total of `topic`, every cause."""
    return sum(sample.value for metric in proxy.metrics.registry.collect() for sample in metric.samples
               if sample.name == "tierproxy_tiered_storage_not_available_total" and sample.labels["topic"] == topic)


async def test_a_full_read_from_s3_equals_what_was_produced(proxy, tiered):
    data = tiered
    consumed = await consume_aiokafka(proxy.bootstrap_servers, data.topic, len(data.records),
                                      max_partition_fetch_bytes=64 * 1024)
    assert in_partition_order(record_keys(consumed)) == expected_by_partition(data.records)
    assert proxy.metrics.value("tierproxy_remote_bytes_in_total", {"topic": data.topic}) > 0
    assert _not_available(proxy, data.topic) == 0


async def test_outage_local_flows_remote_resumes_after_s3_returns(proxy, tiered, s3, caplog):
    data = tiered
    expected = expected_by_partition(data.records)
    caplog.set_level(logging.WARNING, logger="tierproxy")
    consumer = AIOKafkaConsumer(bootstrap_servers=proxy.bootstrap_servers, enable_auto_commit=False,
                                auto_offset_reset="earliest", max_partition_fetch_bytes=16 * 1024)
    await consumer.start()
    consumed: list[tuple] = []
    confluent_errors: list[KafkaError] = []
    confluent_out: list[list[tuple]] = []
    stop_confluent = threading.Event()
    confluent = threading.Thread(target=lambda: confluent_out.append(consume_confluent_assigned(
        {"bootstrap.servers": proxy.bootstrap_servers}, data.topic, range(PARTITIONS), len(data.records),
        timeout_s=150, errors=confluent_errors, stop=stop_confluent)))
    try:
        consumer.assign([TopicPartition(data.topic, p) for p in range(PARTITIONS)])

        async def poll() -> None:
            batches = await consumer.getmany(timeout_ms=200, max_records=200)
            for batch in batches.values():
                consumed.extend(record_keys(batch))

        def count(partition: int, got: list[tuple] = consumed) -> int:
            return sum(1 for r in got if r[0] == partition)

        # Mid-consumption: some remote records of partition 0 arrived, then S3 goes away.
        deadline = time.monotonic() + 60
        while count(0) == 0 and time.monotonic() < deadline:
            await poll()
        assert 0 < count(0) < data.boundary[0]
        s3.stop()
        confluent.start()  # a second client, starting from offset 0 during the outage

        # The local-only partition flows to both; the remote ones get the mapped error.
        deadline = time.monotonic() + 60
        while (count(LOCAL_ONLY) < PER_PARTITION or _not_available(proxy, data.topic) == 0) \
                and time.monotonic() < deadline:
            await poll()
        assert count(LOCAL_ONLY) == PER_PARTITION
        assert _not_available(proxy, data.topic) > 0
        assert any("TIERED_STORAGE_NOT_AVAILABLE" in r.getMessage() for r in caplog.records)
        await wait_until(lambda: any(e.code() == KafkaError.UNKNOWN for e in confluent_errors), 60,
                         "librdkafka reports UNKNOWN_SERVER_ERROR (-1) for a remote partition")
        stalled = {p: count(p) for p in TIERED}
        for _ in range(10):  # while S3 is down, no remote partition gets past its outage point
            await poll()
        assert all(count(p) < data.boundary[p] for p in TIERED), stalled
        assert {p: count(p) for p in TIERED} == stalled

        # S3 is back, empty: upload the same segments again; both consumers finish.
        s3.start(create_bucket=True)
        async with data.storage() as rsm:
            await upload_again(rsm, data.copies)
        deadline = time.monotonic() + 90
        while len(consumed) < len(data.records) and time.monotonic() < deadline:
            await poll()
        await asyncio.to_thread(confluent.join, 120)
    finally:
        stop_confluent.set()
        await consumer.stop()
        if confluent.is_alive():
            await asyncio.to_thread(confluent.join, 30)
        if not s3.answers():
            s3.start(create_bucket=True)

    # Exactly once, in order: the consumed sequence of each partition is the produced one.
    assert in_partition_order(consumed) == expected
    (from_librdkafka,) = confluent_out
    assert in_partition_order(from_librdkafka) == expected
    assert not any(e.code() not in (KafkaError.UNKNOWN, KafkaError._PARTITION_EOF) for e in confluent_errors), \
        {e.code() for e in confluent_errors}


# With the default retry settings (5 attempts, 500 ms backoff growing to 30 s), not the
# fast ones above: the store's retries must still fit in one fetch wait (500 ms).
# TIERPROXY_OUTAGE_S=20 measures the 20 s outage; 8 s keeps the suite short.
OUTAGE_S = float(os.environ.get("TIERPROXY_OUTAGE_S", "8"))


def _sum(proxy: ProxyThread, name: str, topic: str | None = None, **labels: str) -> float:
    """The samples named `name` whose labels include these, added up."""
    if topic is not None:
        labels["topic"] = topic
    return sum(sample.value for metric in proxy.metrics.registry.collect() for sample in metric.samples
               if sample.name == name and labels.items() <= sample.labels.items())


async def test_with_default_retries_an_outage_reaches_the_client_within_one_fetch_wait(kafka_cluster, s3, tiered):
    data = tiered
    config = data.proxy_config(**{"remote.log.chunk.size.bytes": 16 * 1024,
                                  "remote.log.chunk.cache.size.bytes": 64 * 1024})
    assert config["remote.log.storage.s3.max.attempts"] == 5 and config["remote.fetch.max.wait.ms"] == 500
    proxy = ProxyThread(config).start()
    errors: list[KafkaError] = []
    out: list[list[tuple]] = []
    stop = threading.Event()
    wanted = sum(len(data.of(p)) for p in TIERED)
    consumer = threading.Thread(target=lambda: out.append(consume_confluent_assigned(
        {"bootstrap.servers": proxy.bootstrap_servers}, data.topic, TIERED, wanted, timeout_s=120,
        errors=errors, stop=stop)))
    try:
        s3.stop()
        started = time.monotonic()
        consumer.start()
        await wait_until(lambda: _not_available(proxy, data.topic) > 0, 30, "the first TIERED_STORAGE_NOT_AVAILABLE")
        first_after = time.monotonic() - started
        await asyncio.sleep(OUTAGE_S)
        during = _not_available(proxy, data.topic)
        expired = _sum(proxy, "tierproxy_remote_fetch_expired_total", data.topic)
        client_errors = sum(1 for e in errors if e.code() == KafkaError.UNKNOWN)
        print(f"outage of {OUTAGE_S:.0f} s, default retries: first error after {first_after:.2f} s, "
              f"{during:.0f} TIERED_STORAGE_NOT_AVAILABLE, {expired:.0f} expired fetches, "
              f"{client_errors} client errors")
        assert during >= OUTAGE_S  # the alert's metric keeps rising, about every fetch
        assert client_errors >= OUTAGE_S / 2
        # Errors, not silently empty fetches: most reads end in an error within the wait (how many
        # the retries' backoff lets expire depends on how loaded the machine is).
        assert expired < during, (expired, during)
        # The same outage in the latency and error metrics.
        assert _sum(proxy, "tierproxy_remote_storage_request_seconds_count", outcome="error") >= during
        assert _sum(proxy, "tierproxy_remote_read_seconds_count", outcome="error") >= during
        # Read after `during`, while the consumer goes on fetching: at least as many.
        fetch_errors = _sum(proxy, "tierproxy_partition_errors_total", api="FETCH", error="UNKNOWN_SERVER_ERROR")
        assert during <= fetch_errors <= _not_available(proxy, data.topic)
        # Every one blamed on the store, none on the proxy's own readers.
        causes = {sample.labels["cause"] for metric in proxy.metrics.registry.collect() for sample in metric.samples
                  if sample.name == "tierproxy_tiered_storage_not_available_total" and sample.value > 0}
        assert causes == {"store_unavailable"}

        s3.start(create_bucket=True)
        async with data.storage() as rsm:
            await upload_again(rsm, data.copies)
        await asyncio.to_thread(consumer.join, 120)
        after = _not_available(proxy, data.topic)
        await asyncio.sleep(2)
        assert _not_available(proxy, data.topic) == after  # it stops once the store is back
        for operation in ("get", "get_range"):
            assert _sum(proxy, "tierproxy_remote_storage_request_seconds_count", operation=operation, outcome="ok") > 0
        assert _sum(proxy, "tierproxy_remote_read_seconds_count", outcome="ok") > 0
        assert _sum(proxy, "tierproxy_broker_query_seconds_count", api="LIST_OFFSETS") > 0
    finally:
        stop.set()
        if consumer.is_alive():
            await asyncio.to_thread(consumer.join, 30)
        if not s3.answers():
            s3.start(create_bucket=True)
        proxy.stop()
    (consumed,) = out
    expected = expected_by_partition(data.records)
    assert in_partition_order(consumed) == {p: expected[p] for p in TIERED}
