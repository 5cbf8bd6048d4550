"""`tierproxy loadtest` against the real broker and against the proxy over a topic whose
older part is remote only (the broker trimmed): the counts are what was produced, the
summary is sane, --from takes an offset and a timestamp, --json parses, and errors are
counted by Kafka's names."""

from __future__ import annotations

import json
import uuid

import pytest

from tierproxy.cli import main
from tierproxy.loadtest import LatencyWindow, LoadTest, StartPosition, merge_latency, parse_start
from tests.helpers.fixtures import proxy_fixture, tiered_fixture
from tests.helpers.tiered import Timed, TieredTopic, TopicSpec

PARTITIONS = 3
PER_PARTITION = 3000
PRODUCED = PARTITIONS * PER_PARTITION
STATS_MS = 20  # short runs: fine statistics windows, so that fetch latencies are reported
# The i-th record of each partition stamped i ms after the first, a minute ago; about the
# first half of every partition remote only, the broker trimmed.
SPEC = TopicSpec(Timed(PER_PARTITION, value_size=300, step_ms=1, age_ms=60_000), partitions=PARTITIONS,
                 fraction=0.5, segment_bytes=64 * 1024)
pytestmark = pytest.mark.timeout(180)


tiered = tiered_fixture(SPEC)
proxy = proxy_fixture(**{"remote.log.chunk.size.bytes": 64 * 1024})


def _local(tiered: TieredTopic) -> int:
    return sum(PER_PARTITION - start for start in tiered.boundary.values())


def _payload_bytes(tiered: TieredTopic) -> int:
    """Key and value bytes of every record."""
    return sum(len(r.key) + len(r.value) for r in tiered.records)


def _base_timestamp(tiered: TieredTopic) -> int:
    """The first record's timestamp in every partition; the i-th is i ms later."""
    return tiered.records[0].timestamp_ms


def _check_sane(summary) -> None:
    assert summary.seconds > 0 and summary.mb_per_s > 0 and summary.records_per_s > 0
    assert summary.fetch_latency_requests > 0
    assert 0 <= summary.fetch_latency_p50_ms <= summary.fetch_latency_p99_ms


def test_direct_from_the_broker_sees_only_the_local_part(kafka_cluster, tiered):
    summary = LoadTest(kafka_cluster.bootstrap_servers, tiered.topic, consumers=2,
                       stats_interval_ms=STATS_MS).run()
    assert summary.records == _local(tiered) < PRODUCED
    assert summary.partitions == summary.partitions_at_end == PARTITIONS
    assert summary.stopped_by == "end" and summary.errors == {}
    _check_sane(summary)


def test_through_the_proxy_every_record_once(proxy, tiered):
    summary = LoadTest(proxy.bootstrap_servers, tiered.topic, consumers=2, stats_interval_ms=STATS_MS).run()
    assert summary.records == PRODUCED
    assert summary.bytes == _payload_bytes(tiered)
    assert summary.partitions_at_end == PARTITIONS and summary.errors == {}
    _check_sane(summary)
    assert proxy.metrics.value("tierproxy_remote_partitions_served_total", {"topic": tiered.topic}) > 0


def test_replays_each_read_every_partition(proxy, tiered, capsys):
    code = main(["loadtest", "--bootstrap", proxy.bootstrap_servers, "--topic", tiered.topic, "--replays", "3",
                 "--consumers", "2", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["replays"] == 3 and summary["consumers"] == 2 and summary["partitions"] == PARTITIONS
    assert summary["records"] == 3 * PRODUCED and summary["bytes"] == 3 * _payload_bytes(tiered)
    assert summary["partitions_at_end"] == 3 * PARTITIONS and summary["errors"] == {}


def test_from_an_offset_in_the_remote_part(proxy, tiered):
    start = min(tiered.boundary.values()) // 3
    summary = LoadTest(proxy.bootstrap_servers, tiered.topic, consumers=PARTITIONS + 1,  # one without partitions
                       start=StartPosition("offset", start), stats_interval_ms=STATS_MS).run()
    assert summary.records == PARTITIONS * (PER_PARTITION - start)
    assert summary.errors == {}


def test_from_a_timestamp_with_the_json_summary(proxy, tiered, capsys):
    skipped = PER_PARTITION // 4  # in the remote part of every partition
    code = main(["loadtest", "--bootstrap", proxy.bootstrap_servers, "--topic", tiered.topic, "--consumers", "3",
                 "--from", f"@{_base_timestamp(tiered) + skipped}", "--stats-interval-ms", str(STATS_MS), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records"] == PARTITIONS * (PER_PARTITION - skipped)
    assert summary["from"] == f"timestamp {_base_timestamp(tiered) + skipped}"
    assert summary["mb_per_s"] > 0 and summary["records_per_s"] > 0
    assert summary["fetch_latency_ms"]["p99"] >= summary["fetch_latency_ms"]["p50"] >= 0
    assert summary["errors"] == {} and summary["stopped_by"] == "end"


def test_max_records_is_exact(proxy, tiered):
    summary = LoadTest(proxy.bootstrap_servers, tiered.topic, consumers=3, max_records=1234).run()
    assert summary.records == 1234 and summary.stopped_by == "max-records"


def test_a_missing_topic_is_counted_by_name(proxy, capsys):
    code = main(["loadtest", "--bootstrap", proxy.bootstrap_servers, "--topic", f"missing-{uuid.uuid4().hex[:8]}",
                 "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 1
    assert summary["records"] == 0 and summary["errors"] == {"UNKNOWN_TOPIC_OR_PART": 1}


def test_text_summary_and_progress(kafka_cluster, tiered, capsys):
    code = main(["loadtest", "--bootstrap", kafka_cluster.bootstrap_servers, "--topic", tiered.topic,
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
