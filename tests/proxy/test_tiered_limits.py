"""The remote reader's limits under load, against a slow store, and the metrics endpoint.

The proxy reads S3 (moto) through a loopback relay that holds every request for a
while, as an object store's first-byte latency would. One remote log reader, one
waiting place: six consumers replaying six remote partitions at once overflow it, and
the partitions that do not fit get an immediate error (never a wait in an unbounded
queue); reads slower than remote.fetch.max.wait.ms answer empty records without an
error. The consumers retry and every one of them still gets all its records.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client import start_http_server

from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from testbed.ports import LOOPBACK, free_port
from testbed.s3 import S3Server
from tests.proxy.test_passthrough import ProxyThread, proxy_config
from tests.proxy.tiered_helpers import (
    TieredTopic,
    expected_by_partition,
    produce_timed,
    record_keys,
    s3_proxy_settings,
    s3_storage,
    tier_and_trim,
)

PARTITIONS = 6
PER_PARTITION = 600
STORE_DELAY_S = 0.15  # per request to the store
FETCH_MAX_WAIT_MS = 250  # shorter than a read that misses the caches (manifest, index, chunk)
PREFIX = "limits"
pytestmark = [pytest.mark.timeout(240), pytest.mark.s3]


class DelayRelay:
    """A TCP relay on loopback, in a thread of its own: every chunk of bytes a client
    sends reaches the upstream `delay_s` later. Answers flow back at once."""

    def __init__(self, upstream_port: int, delay_s: float) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="delay-relay", daemon=True)

    def start(self) -> DelayRelay:
        self._thread.start()
        assert self._ready.wait(10), "relay did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._relay, LOOPBACK, 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_writer, self.delay_s), self._pump(up_reader, writer, 0.0))

    @staticmethod
    async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, delay_s: float) -> None:
        try:
            while data := await source.read(65536):
                if delay_s:
                    await asyncio.sleep(delay_s)
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            sink.close()


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = S3Server(bucket="tierproxy-limits")
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def slow_s3(s3) -> Iterator[DelayRelay]:
    relay = DelayRelay(s3.port, STORE_DELAY_S).start()
    yield relay
    relay.stop()


@pytest.fixture(scope="module")
def tiered(kafka_cluster, s3, tmp_path_factory) -> Iterator[tuple[TieredTopic, Path]]:
    topic = f"limits-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, partitions=PARTITIONS)
    root = tmp_path_factory.mktemp("limits")
    records = produce_timed(kafka_cluster.client_config(), topic, PARTITIONS, PER_PARTITION)

    async def build() -> TieredTopic:
        async with s3_storage(s3, PREFIX) as rsm, FileRemoteLogMetadataManager(root / "metadata") as rlmm:
            return await tier_and_trim(kafka_cluster.bootstrap_servers, topic, records, rsm=rsm, rlmm=rlmm,
                                       work_dir=root / "work", segment_bytes=32 * 1024)

    data = asyncio.run(build())
    assert all(data.boundary[p] > 0 for p in range(PARTITIONS))
    yield data, root
    kafka_cluster.delete_topic(topic)


@pytest.fixture(scope="module")
def proxy(kafka_cluster, s3, slow_s3, tiered) -> Iterator[ProxyThread]:
    _, root = tiered
    config = proxy_config(kafka_cluster.bootstrap_servers, nodes=1, **{
        **s3_proxy_settings(slow_s3.endpoint_url, s3, PREFIX),
        "remote.log.metadata.dir": root / "metadata",
        "remote.log.reader.threads": 1,
        "remote.log.reader.max.pending.tasks": 1,
        "remote.fetch.max.wait.ms": FETCH_MAX_WAIT_MS,
        "remote.log.chunk.size.bytes": 16 * 1024,
        "remote.log.read.ahead.chunks": 1,
        "metrics.port": free_port(),
    })
    proxy = ProxyThread(config).start()
    yield proxy
    proxy.stop()


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
    data, _ = tiered
    expected = expected_by_partition(data)
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
    data, _ = tiered
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
