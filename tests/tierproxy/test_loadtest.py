"""`tierproxy loadtest` against the real broker and against the proxy over a topic whose
older part is remote only (the broker trimmed): the counts are what was produced, the
summary is sane, --from takes an offset and a timestamp, --json parses, and errors are
counted by Kafka's names."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tierproxy.cli import main
from tierproxy.loadtest import LatencyWindow, LoadTest, StartPosition, merge_latency, parse_start
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tests.proxy.test_passthrough import ProxyThread, running_proxy
from tests.proxy.tiered_helpers import local_proxy_settings, tier_and_trim

PARTITIONS = 3
PER_PARTITION = 3000
VALUE_BYTES = 300
STATS_MS = 20  # short runs: fine statistics windows, so that fetch latencies are reported
pytestmark = pytest.mark.timeout(180)


@dataclass
class Topic:
    name: str
    base_timestamp: int
    boundary: dict[int, int]  # partition -> the broker's local log start after trimming
    payload_bytes: int  # key + value bytes of every record
    root: Path

    @property
    def produced(self) -> int:
        return PARTITIONS * PER_PARTITION

    @property
    def local(self) -> int:
        return sum(PER_PARTITION - start for start in self.boundary.values())


def _produce(bootstrap: str, topic: str, base_timestamp: int) -> int:
    """PER_PARTITION records per partition, the i-th of each at base_timestamp + i ms."""
    # Idempotent: a batch retried while the new topic's leadership settles keeps its place,
    # so offset i holds record i in every partition.
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 64 * 1024,
                         "compression.type": "none", "enable.idempotence": True})
    size = 0
    for i in range(PER_PARTITION):
        for partition in range(PARTITIONS):
            key = f"{partition}-{i}".encode()
            value = key.ljust(VALUE_BYTES, b".")
            size += len(key) + len(value)
            producer.produce(topic, key=key, value=value, partition=partition, timestamp=base_timestamp + i)
        producer.poll(0)
    assert producer.flush(30) == 0
    return size


@pytest.fixture(scope="module")
def tiered(kafka_cluster, tmp_path_factory) -> Iterator[Topic]:
    """About the first half of every partition remote only, the broker trimmed."""
    name = f"loadtest-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(name, partitions=PARTITIONS)
    bootstrap = kafka_cluster.bootstrap_servers
    root = tmp_path_factory.mktemp("remote")
    base_timestamp = int(time.time() * 1000) - 60_000
    size = _produce(bootstrap, name, base_timestamp)

    async def tier() -> dict[int, int]:
        async with LocalRemoteStorageManager(root / "remote") as rsm, \
                FileRemoteLogMetadataManager(root / "metadata") as rlmm:
            tiered = await tier_and_trim(bootstrap, name, [], rsm=rsm, rlmm=rlmm, work_dir=root / "work",
                                         fraction=0.5, segment_bytes=64 * 1024)
        return tiered.boundary

    yield Topic(name, base_timestamp, asyncio.run(tier()), size, root)
    kafka_cluster.delete_topic(name)


@pytest.fixture(scope="module")
def proxy(kafka_cluster, tiered) -> Iterator[ProxyThread]:
    with running_proxy(kafka_cluster.bootstrap_servers, nodes=1, **local_proxy_settings(tiered.root),
                       **{"remote.log.chunk.size.bytes": 64 * 1024}) as proxy:
        yield proxy


def _check_sane(summary) -> None:
    assert summary.seconds > 0 and summary.mb_per_s > 0 and summary.records_per_s > 0
    assert summary.fetch_latency_requests > 0
    assert 0 <= summary.fetch_latency_p50_ms <= summary.fetch_latency_p99_ms


def test_direct_from_the_broker_sees_only_the_local_part(kafka_cluster, tiered):
    summary = LoadTest(kafka_cluster.bootstrap_servers, tiered.name, consumers=2,
                       stats_interval_ms=STATS_MS).run()
    assert summary.records == tiered.local < tiered.produced
    assert summary.partitions == summary.partitions_at_end == PARTITIONS
    assert summary.stopped_by == "end" and summary.errors == {}
    _check_sane(summary)


def test_through_the_proxy_every_record_once(proxy, tiered):
    summary = LoadTest(proxy.bootstrap_servers, tiered.name, consumers=2, stats_interval_ms=STATS_MS).run()
    assert summary.records == tiered.produced
    assert summary.bytes == tiered.payload_bytes
    assert summary.partitions_at_end == PARTITIONS and summary.errors == {}
    _check_sane(summary)
    assert proxy.metrics.value("tierproxy_remote_partitions_served_total", {"topic": tiered.name}) > 0


def test_replays_each_read_every_partition(proxy, tiered, capsys):
    code = main(["loadtest", "--bootstrap", proxy.bootstrap_servers, "--topic", tiered.name, "--replays", "3",
                 "--consumers", "2", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["replays"] == 3 and summary["consumers"] == 2 and summary["partitions"] == PARTITIONS
    assert summary["records"] == 3 * tiered.produced and summary["bytes"] == 3 * tiered.payload_bytes
    assert summary["partitions_at_end"] == 3 * PARTITIONS and summary["errors"] == {}


def test_from_an_offset_in_the_remote_part(proxy, tiered):
    start = min(tiered.boundary.values()) // 3
    summary = LoadTest(proxy.bootstrap_servers, tiered.name, consumers=PARTITIONS + 1,  # one without partitions
                       start=StartPosition("offset", start), stats_interval_ms=STATS_MS).run()
    assert summary.records == PARTITIONS * (PER_PARTITION - start)
    assert summary.errors == {}


def test_from_a_timestamp_with_the_json_summary(proxy, tiered, capsys):
    skipped = PER_PARTITION // 4  # in the remote part of every partition
    code = main(["loadtest", "--bootstrap", proxy.bootstrap_servers, "--topic", tiered.name, "--consumers", "3",
                 "--from", f"@{tiered.base_timestamp + skipped}", "--stats-interval-ms", str(STATS_MS), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records"] == PARTITIONS * (PER_PARTITION - skipped)
    assert summary["from"] == f"timestamp {tiered.base_timestamp + skipped}"
    assert summary["mb_per_s"] > 0 and summary["records_per_s"] > 0
    assert summary["fetch_latency_ms"]["p99"] >= summary["fetch_latency_ms"]["p50"] >= 0
    assert summary["errors"] == {} and summary["stopped_by"] == "end"


def test_max_records_is_exact(proxy, tiered):
    summary = LoadTest(proxy.bootstrap_servers, tiered.name, consumers=3, max_records=1234).run()
    assert summary.records == 1234 and summary.stopped_by == "max-records"


def test_a_missing_topic_is_counted_by_name(proxy, capsys):
    code = main(["loadtest", "--bootstrap", proxy.bootstrap_servers, "--topic", f"missing-{uuid.uuid4().hex[:8]}",
                 "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 1
    assert summary["records"] == 0 and summary["errors"] == {"UNKNOWN_TOPIC_OR_PART": 1}


def test_text_summary_and_progress(kafka_cluster, tiered, capsys):
    code = main(["loadtest", "--bootstrap", kafka_cluster.bootstrap_servers, "--topic", tiered.name,
                 "--max-records", "10"])
    out = capsys.readouterr().out
    assert code == 0
    assert "10 records" in out and "MB/s" in out and "fetch latency" in out and "errors: none" in out


def test_parse_start():
    assert parse_start("earliest") == StartPosition("earliest")
    assert parse_start("42") == StartPosition("offset", 42)
    assert parse_start("@1700000000000") == StartPosition("timestamp", 1_700_000_000_000)
    assert parse_start("2023-11-14T22:13:20Z") == StartPosition("timestamp", 1_700_000_000_000)
    with pytest.raises(ValueError):
        parse_start("yesterday")


def test_merged_latency_is_exact_for_one_window_and_never_below_the_truth():
    one = LatencyWindow.from_rtt({"cnt": 100, "min": 1, "p50": 10, "p75": 20, "p90": 30, "p95": 40, "p99": 90,
                                  "p99_99": 95, "max": 100})
    assert merge_latency([one], (0.5, 0.99)) == [10, 90]
    # A slow window with few requests moves the p99 up, barely the p50.
    slow = LatencyWindow.from_rtt({"cnt": 10, "min": 500, "p50": 500, "p75": 500, "p90": 500, "p95": 500,
                                   "p99": 500, "p99_99": 500, "max": 500})
    p50, p99 = merge_latency([one, slow], (0.5, 0.99))
    assert p50 == 20 and p99 == 500
    assert LatencyWindow.from_rtt({"cnt": 0}) is None
    assert merge_latency([], (0.5,)) == [None]
