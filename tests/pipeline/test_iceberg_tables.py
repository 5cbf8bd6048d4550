"""Iceberg tables that follow the tier: a tiering pass with `topic.<name>.iceberg.enable=true`
appends the records of the remote segments to the topic's table (SQL catalog in SQLite, the
warehouse in the local store), exactly as a read_committed consumer sees them, and exactly once."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from tierproxy.pipeline.iceberg.commit import ADDED_OFFSETS, COMMITTED_OFFSETS, PENDING_WRITE, table_offsets
from tierproxy.pipeline.tier import format_summary, run_pass
from tests.helpers.iceberg import (
    TOPIC_CONFIG,
    committed,
    killed_backfill,
    produce_everything,
    properties_file,
    remote_ends,
    spark_rows,
    table_of,
    table_rows,
)
from tests.helpers.pipeline import BROKER_SEGMENT_BYTES, assert_clean, tier_config
from tests.helpers.produce import produce_codecs, until_older

PARTITIONS = 4  # the last one stays empty
# Ship the tail: it is older than this when a pass runs (the tests wait for it).
SEGMENT_MS = 3000
# A broker, Spark and a pass set up on a shared two-core machine.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def tiered(spark, kafka_cluster, tmp_path_factory):
    """The topic produced and tiered by one pass, which appended it to its table."""
    from testbed.fixtures import Topics

    topics = Topics(kafka_cluster, "iceberg")
    name = topics(partitions=PARTITIONS, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES, **TOPIC_CONFIG})
    records = asyncio.run(produce_everything(kafka_cluster.bootstrap_servers, name, PARTITIONS - 1))
    asyncio.run(until_older(records, SEGMENT_MS))
    config = tier_config(tmp_path_factory.mktemp("iceberg"), kafka_cluster.bootstrap_servers, name,
                         topic_settings={"segment.ms": SEGMENT_MS, "iceberg.enable": "true"})
    report = run_pass(config, spark)
    yield config, name, records, report
    topics.delete_all()


def _remote_ends(config, name) -> dict[int, int]:
    return asyncio.run(remote_ends(config, name))


def test_a_pass_appends_what_a_read_committed_consumer_sees(tiered):
    config, name, records, report = tiered
    assert_clean(report)
    assert not [r for r in records if r.partition == PARTITIONS - 1]
    aborted = [r for r in records if not r.committed]
    assert aborted and {r.source for r in records} >= {"aiokafka-gzip", "aiokafka-snappy", "aiokafka-lz4",
                                                       "aiokafka-zstd", "aiokafka-none", "specials"}
    ends = _remote_ends(config, name)
    # Everything produced was tiered (the pass shipped the tail, older than segment.ms), so the
    # table must hold every committed record.
    assert all(ends[p] > max(r.offset for r in records if r.partition == p) for p in range(PARTITIONS - 1))
    rows = table_rows(config, name)
    assert rows == committed(records)
    by_key = {row[2]: row for row in rows if row[0] == 0}
    assert by_key[b"deleted"][3] is None  # the tombstone is kept
    assert by_key[b"dup"][4] == (("h", b"1"), ("h", b"2"), ("other", b""), ("h", b"3"))
    assert len(by_key[b"big"][3]) > 1 << 20
    assert None in by_key  # the record without a key
    (line,) = [line for line in format_summary(report).splitlines() if line.startswith(f"iceberg kafka.{name}:")]
    assert f"{len(rows)} rows" in line


def test_spark_reads_the_same_rows(tiered, spark):
    config, name, records, _ = tiered
    assert spark_rows(spark, config, name) == table_rows(config, name)


def test_the_table_says_what_it_holds_and_its_columns(tiered):
    config, name, records, report = tiered
    table = table_of(config, name)
    summary = table.current_snapshot().summary.additional_properties
    ends = _remote_ends(config, name)
    assert json.loads(summary[COMMITTED_OFFSETS]) == {str(p): e for p, e in ends.items()}
    assert json.loads(summary[ADDED_OFFSETS]) == {str(p): [0, e] for p, e in ends.items()}
    assert PENDING_WRITE not in table.properties
    arrow = table.scan().to_arrow()
    assert arrow.schema.names == ["partition", "offset", "timestamp", "timestamp_type", "leader_epoch", "key",
                                  "value", "headers"]
    assert str(arrow.schema.field("timestamp").type) == "timestamp[us, tz=UTC]"
    assert set(arrow.column("timestamp_type").to_pylist()) == {0}
    assert min(arrow.column("leader_epoch").to_pylist()) >= 0
    assert [f.name for f in table.spec().fields] == ["timestamp_day"]


def test_a_second_pass_adds_nothing_and_a_third_only_what_is_new(tiered, spark, kafka_cluster):
    config, name, records, _ = tiered
    before = table_of(config, name).current_snapshot().snapshot_id
    report = run_pass(config, spark)
    assert_clean(report)
    assert table_of(config, name).current_snapshot().snapshot_id == before
    more = asyncio.run(produce_codecs(kafka_cluster.bootstrap_servers, name, PARTITIONS - 1, 40))
    asyncio.run(until_older(more, SEGMENT_MS))
    report = run_pass(config, spark)
    assert_clean(report)
    (table_report,) = report.tables
    assert table_report.rows == len(more)
    assert table_rows(config, name) == committed(records + more)
    assert table_offsets(table_of(config, name)).next_offsets == _remote_ends(config, name)


def test_status_shows_each_tables_offsets_lag_and_dead_letters(tiered, tmp_path, capsys):
    from tierproxy.status import status

    config, name, _, _ = tiered
    ends = _remote_ends(config, name)
    properties = properties_file(config, tmp_path / "tier.properties")
    assert status(properties, [], as_json=True, timeout=30, out=sys.stdout, err=sys.stderr) == 0
    (table,) = json.loads(capsys.readouterr().out)["iceberg_tables"]
    assert table["table"] == f"kafka.{name}" and table["exists"]
    assert table["committed"] == {str(p): ends.get(p, 0) for p in range(PARTITIONS)}
    assert (table["lag_segments"], table["lag_offsets"], table["dead_letters"]) == (0, 0, 0)

    # A namespace with no table yet: all of the tier is its lag.
    assert status(properties, ["iceberg.namespace=lagging"], as_json=False, timeout=30, out=sys.stdout,
                  err=sys.stderr) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith(f"lagging.{name} ")]
    assert "(no table yet)" in line and line.split()[-2] == str(sum(ends.values()))


def test_a_catalog_that_does_not_answer_fails_the_table_step_not_the_pass(tiered, spark):
    import socket

    config, name, _, _ = tiered
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    down = config.with_overrides({"iceberg.catalog.type": "rest", "iceberg.catalog.uri": f"http://127.0.0.1:{port}"})
    report = run_pass(down, spark)
    assert not report.ok and report.error is None
    (error,) = report.errors
    assert error.startswith(f"iceberg kafka.{name}: ") and "Connection" in error
    assert not any(p.error for p in report.partitions)
    assert f"ERROR iceberg kafka.{name}: " in format_summary(report)


def test_a_backfill_through_a_rest_catalog_holds_the_same_rows(tiered, spark, iceberg_rest_catalog):
    """Apache Iceberg's own REST catalog server (testbed): the same pass, the same rows, the
    same offsets recorded, and a second run adds nothing."""
    import io

    from tierproxy.pipeline.iceberg.append import append_tables

    config, name, _, _ = tiered
    rest = config.with_overrides({f"iceberg.catalog.{key}": value
                                  for key, value in iceberg_rest_catalog.client_properties().items()})
    (report,) = append_tables(rest, spark, topics=[name], stream=io.StringIO())
    assert report.error is None
    rows = table_rows(rest, name)
    # The SQL catalog's table holds every committed record tiered so far (the tests before this one).
    assert rows and rows == table_rows(config, name)
    held = table_offsets(table_of(rest, name))
    assert held.next_offsets == _remote_ends(config, name)
    assert held.topic_id == table_offsets(table_of(config, name)).topic_id
    (again,) = append_tables(rest, spark, topics=[name], stream=io.StringIO())
    assert again.error is None and table_rows(rest, name) == rows


def test_a_pass_killed_before_its_commit_leaves_nothing_visible_and_the_next_cleans_up(tiered, spark, tmp_path):
    from tierproxy.pipeline.iceberg.append import append_tables
    from tierproxy.pipeline.iceberg.commit import files_of_write

    config, name, _, _ = tiered
    # A table of its own (another namespace of the same catalog) over the same remote segments.
    killed = config.with_overrides({"iceberg.namespace": "killed", "spark.master": "local[1]"})
    result = killed_backfill(killed, name, tmp_path / "tier.properties")
    assert result.returncode == -9, result.stderr[-3000:]
    assert "appended" in result.stderr  # the tasks wrote their files

    table = table_of(killed, name)
    assert table.current_snapshot() is None
    write_id = table.properties[PENDING_WRITE]
    leftovers = files_of_write(table, write_id)
    assert leftovers
    assert table.scan().to_arrow().num_rows == 0

    (report,) = append_tables(killed, spark)
    assert report.error is None and report.cleaned == len(leftovers)
    assert files_of_write(table_of(killed, name), write_id) == []
    # Each offset once: the same rows as the table the passes kept.
    assert table_rows(killed, name) == table_rows(config, name)
    assert PENDING_WRITE not in table_of(killed, name).properties


def test_a_backfill_waits_for_no_tiering_pass_it_fails_at_once(tiered, tmp_path, capsys):
    from tierproxy.cli import main
    from tierproxy.pipeline.tier import pipeline_lock

    config, name, _, _ = tiered
    properties = properties_file(config, tmp_path / "tier.properties")
    before = table_of(config, name).current_snapshot().snapshot_id
    with pipeline_lock(config):
        assert main(["iceberg", "backfill", "--config", properties]) == 1
    assert "another tiering pass is running" in capsys.readouterr().err
    assert table_of(config, name).current_snapshot().snapshot_id == before


def test_backfill_names_a_topic_without_a_table(tiered, tmp_path, capsys):
    from tierproxy.cli import main

    config, _, _, _ = tiered
    properties = properties_file(config, tmp_path / "tier.properties")
    assert main(["iceberg", "backfill", "--config", properties, "--topic", "nope"]) == 2
    assert "nope: no Iceberg table" in capsys.readouterr().err


def test_maintain_compacts_expires_and_keeps_the_offsets(tiered, spark):
    from tierproxy.pipeline.iceberg.maintain import maintain_tables

    config, name, _, _ = tiered
    rows = table_rows(config, name)
    held = table_offsets(table_of(config, name)).next_offsets
    files = len(list(table_of(config, name).scan().plan_files()))
    snapshots = len(table_of(config, name).snapshots())
    assert snapshots >= 2

    (report,) = maintain_tables(config.with_overrides({"iceberg.snapshot.max.age.ms": "0"}), [name])
    assert report.error is None
    table = table_of(config, name)
    assert report.files_compacted > 1 and len(list(table.scan().plan_files())) < files
    assert report.snapshots_expired >= snapshots - 1 and len(table.snapshots()) == 1
    assert report.files_deleted >= report.files_compacted
    assert table_rows(config, name) == rows
    assert table_offsets(table).next_offsets == held

    # Row retention: rows older than the cut-off go, and no pass brings them back.
    cutoff = sorted(row[5] for row in rows)[len(rows) // 2]
    (report,) = maintain_tables(config.with_overrides({f"topic.{name}.iceberg.retention.ms": "1000"}), [name],
                                now_ms=cutoff + 1000)
    assert report.error is None and report.rows_deleted
    assert table_rows(config, name) == [row for row in rows if row[5] >= cutoff]
    assert table_offsets(table_of(config, name)).next_offsets == held
    report = run_pass(config, spark)
    assert_clean(report)
    assert table_rows(config, name) == [row for row in rows if row[5] >= cutoff]
