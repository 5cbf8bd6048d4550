"""The remote reader's limits under load, against a slow store, and the metrics endpoint.

The proxy reads S3 (moto) through a loopback relay that holds back every answer for a
while, as an object store's first-byte latency would. One remote log reader, one
waiting place: six consumers replaying six remote partitions at once overflow it, and
the partitions that do not fit get an immediate error (never a wait in an unbounded
queue); reads slower than remote.fetch.max.wait.ms answer empty records without an
error. The consumers retry and every one of them still gets all its records.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client import start_http_server

from testbed.latency import LatencyRelay
from testbed.ports import LOOPBACK, free_port
from tests.helpers.consume import expected_by_partition, record_keys
from tests.helpers.fixtures import tiered_fixture
from tests.helpers.proxy import ProxyThread
from tests.helpers.tiered import Timed, TopicSpec

PARTITIONS = 6
PER_PARTITION = 600
STORE_DELAY_MS = 150  # per request to the store
FETCH_MAX_WAIT_MS = 250  # shorter than a read that misses the caches (manifest, index, chunk)
SPEC = TopicSpec(Timed(PER_PARTITION), partitions=PARTITIONS, store="s3")
pytestmark = [pytest.mark.timeout(240), pytest.mark.s3]


tiered = tiered_fixture(SPEC, s3="s3_server")


@pytest.fixture(scope="module")
def slow_s3(s3_server, tmp_path_factory) -> Iterator[LatencyRelay]:
    with LatencyRelay(s3_server.endpoint_url, STORE_DELAY_MS, tmp_path_factory.mktemp("slow-s3")) as relay:
        yield relay


@pytest.fixture(scope="module")
def proxy(tiered, slow_s3) -> Iterator[ProxyThread]:
    with tiered.proxy(**{
        "remote.log.storage.s3.endpoint.url": slow_s3.endpoint_url,
        "remote.log.reader.threads": 1,
        "remote.log.reader.max.pending.tasks": 1,
        "remote.fetch.max.wait.ms": FETCH_MAX_WAIT_MS,
        "remote.log.chunk.size.bytes": 16 * 1024,
        "remote.log.read.ahead.chunks": 1,
        "metrics.port": free_port(),
    }) as proxy:
        yield proxy


async def _replay(bootstrap: str, topic: str, partition: int, count: int, deadline: float) -> list[tuple]:
    """One consumer on one partition from offset 0, until it has `count` records."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                                max_partition_fetch_bytes=16 * 1024)
    await consumer.start()
    consumed: list[tuple] = []
    try:
        consumer.assign([TopicPartition(topic, partition)])
        while len(consumed) < count and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=300)).values():
                consumed.extend(record_keys(batch))
    finally:
        await consumer.stop()
    return consumed


async def test_a_full_reader_queue_is_an_error_not_a_wait_and_everyone_finishes(proxy, tiered):
    data = tiered
    expected = expected_by_partition(data.records)
    deadline = time.monotonic() + 150
    results = await asyncio.gather(*(
        _replay(proxy.bootstrap_servers, data.topic, p, PER_PARTITION, deadline) for p in range(PARTITIONS)))
    metrics = proxy.metrics
    queue_full = metrics.value("tierproxy_remote_read_errors_total", {"topic": data.topic, "reason": "queue_full"})
    expired = metrics.value("tierproxy_remote_fetch_expired_total", {"topic": data.topic})
    assert queue_full > 0
    assert expired > 0
    # The refused and expired reads were retried by the consumers: all records, once, in order.
    for partition, consumed in enumerate(results):
        assert consumed == expected[partition], (partition, len(consumed))
    # Nothing waits once the consumers are gone.
    assert metrics.value("tierproxy_remote_log_reader_task_queue_size") == 0


def test_metrics_endpoint_lists_the_remote_metrics(proxy, tiered):
    data = tiered
    # ProxyThread runs the server alone; `tierproxy serve` adds this endpoint on metrics.port.
    port = proxy.config["metrics.port"]
    http, _ = start_http_server(port, addr=LOOPBACK, registry=proxy.metrics.registry)
    try:
        consumed = asyncio.run(_replay(proxy.bootstrap_servers, data.topic, 0, 10, time.monotonic() + 60))
        assert len(consumed) >= 10
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=10) as response:
            exposition = response.read().decode()
    finally:
        http.shutdown()
        http.server_close()
    samples = {}
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            name_and_labels, value = line.rsplit(" ", 1)
            samples[name_and_labels] = float(value)
    for name, kind in (("tierproxy_remote_read_requests_total", "counter"),
                       ("tierproxy_remote_bytes_in_total", "counter"),
                       ("tierproxy_remote_read_errors_total", "counter"),
                       ("tierproxy_remote_log_reader_task_queue_size", "gauge"),
                       ("tierproxy_remote_log_reader_avg_idle_percent", "gauge"),
                       ("tierproxy_cache_hits_total", "counter"),
                       ("tierproxy_connections_active", "gauge")):
        assert f"# TYPE {name} {kind}" in exposition, name
    topic = f'topic="{data.topic}"'
    assert samples[f"tierproxy_remote_read_requests_total{{{topic}}}"] > 0
    assert samples[f"tierproxy_remote_bytes_in_total{{{topic}}}"] > 0
    assert samples["tierproxy_remote_log_reader_task_queue_size"] == 0
    assert 0.0 <= samples["tierproxy_remote_log_reader_avg_idle_percent"] <= 1.0
