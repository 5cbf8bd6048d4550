"""Typed tables that follow the tier: with `topic.<name>.iceberg.value.format=avro` a tiering
pass appends each record either to the topic's table, with the value's fields as columns, or,
whole and raw with the reason, to the dead-letter table `<topic>__dlq`; both exactly once."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import time

import fastavro
import pytest
from aiokafka import AIOKafkaProducer

from tierproxy.pipeline.iceberg.commit import COMMITTED_OFFSETS, PENDING_WRITE, files_of_write, table_offsets
from tierproxy.pipeline.iceberg.dead_letters import REASON, dead_letter_table
from tierproxy.pipeline.iceberg.settings import load_catalog, table_settings
from tierproxy.pipeline.tier import run_pass
from tests.helpers.datasource import expected
from tests.helpers.iceberg import arrow_rows, killed_backfill, properties_file, remote_ends, table_of, table_rows
from tests.helpers.pipeline import BROKER_SEGMENT_BYTES, assert_clean, tier_config
from tests.helpers.produce import ProducedRecord, until_older

PARTITIONS = 2
PER_PARTITION = 40  # good records; every 7th is produced bad instead
SEGMENT_MS = 3000
pytestmark = pytest.mark.timeout(600)

ORDER = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": ["null", "double"], "default": None},
]}


def _avro(record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(ORDER), record)
    return out.getvalue()


def _order(partition: int, i: int) -> dict:
    return {"id": partition * 1000 + i, "customer": f"c{i % 5}", "amount": None if i % 3 else i * 1.25}


# Values that are not Avro of the schema, and the start of the reason each gets.
_BAD = [(b"", "value: not Avro of its schema: EOFError"),
        (b"\x02", "value: not Avro of its schema"),  # the id, then nothing
        (_avro({"id": 1, "customer": "x", "amount": None}) + b"\x00", "value: not Avro of its schema: 1 bytes left")]


async def _produce(bootstrap: str, topic: str) -> tuple[list[ProducedRecord], dict[tuple[int, int], dict | str]]:
    """The records, and per (partition, offset) the decoded order or the reason it is a dead
    letter (a tombstone: None)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    sent = []
    base_ms = int(time.time() * 1000)
    try:
        for partition in range(PARTITIONS):
            for i in range(PER_PARTITION):
                key = f"k{partition}-{i}".encode()
                if i % 7 == 3:
                    value, outcome = _BAD[i % len(_BAD)]
                elif i == 12:
                    value, outcome = None, None  # a tombstone
                else:
                    order = _order(partition, i)
                    value, outcome = _avro(order), order
                headers = [("n", str(i).encode())]
                # Given, not the batch's: each record's own timestamp is compared.
                at = base_ms + i
                future = await producer.send(topic, key=key, value=value, partition=partition, headers=headers,
                                             timestamp_ms=at)
                sent.append((future, partition, key, value, tuple(headers), at, outcome))
        await producer.flush()
        records, outcomes = [], {}
        for future, partition, key, value, headers, at, outcome in sent:
            meta = await future
            records.append(ProducedRecord(partition, meta.offset, key, value, headers, at, True, "typed"))
            outcomes[(partition, meta.offset)] = outcome
        return records, outcomes
    finally:
        await producer.stop()


@pytest.fixture(scope="module")
def typed(spark, kafka_cluster, tmp_path_factory):
    """The topic produced and tiered by one pass, which appended it to its two tables."""
    from testbed.fixtures import Topics

    topics = Topics(kafka_cluster, "iceberg-typed")
    name = topics(partitions=PARTITIONS, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
    records, outcomes = asyncio.run(_produce(kafka_cluster.bootstrap_servers, name))
    asyncio.run(until_older(records, SEGMENT_MS))
    tmp = tmp_path_factory.mktemp("iceberg-typed")
    schema = tmp / "order.avsc"
    schema.write_text(json.dumps(ORDER))
    config = tier_config(tmp, kafka_cluster.bootstrap_servers, name,
                         topic_settings={"segment.ms": SEGMENT_MS, "iceberg.enable": "true",
                                         "iceberg.value.format": "avro", "iceberg.value.schema.file": schema})
    report = run_pass(config, spark)
    yield config, name, records, outcomes, report
    topics.delete_all()


def _dead_letters(config, name):
    return load_catalog(config).load_table((table_settings(config, name).namespace, dead_letter_table(name)))


def _tiered(config, name, records: list[ProducedRecord]) -> list[ProducedRecord]:
    ends = asyncio.run(remote_ends(config, name))
    return [r for r in records if r.offset < ends.get(r.partition, 0)]


def _is_dead(outcome) -> bool:
    return isinstance(outcome, str)


def test_rows_are_decoded_and_bad_records_are_dead_letters_with_their_reason(typed):
    config, name, records, outcomes, report = typed
    assert_clean(report)
    tiered = _tiered(config, name, records)
    assert len(tiered) > PARTITIONS * PER_PARTITION // 2 and {r.partition for r in tiered} == set(range(PARTITIONS))
    good = [r for r in tiered if not _is_dead(outcomes[(r.partition, r.offset)])]
    bad = [r for r in tiered if _is_dead(outcomes[(r.partition, r.offset)])]
    assert bad and any(r.value is None for r in good)
    (table_report,) = report.tables
    assert (table_report.rows, table_report.dead_letters) == (len(good), len(bad))

    # Each record in exactly one table, its Kafka columns as produced.
    assert table_rows(config, name) == expected(good)
    dead = _dead_letters(config, name).scan().to_arrow()
    assert arrow_rows(dead) == expected(bad)
    for row in dead.to_pylist():
        assert row[REASON].startswith(outcomes[(row["partition"], row["offset"])]), row

    rows = table_of(config, name).scan().to_arrow().to_pylist()
    for row in rows:
        order = outcomes[(row["partition"], row["offset"])]
        decoded = {field: row[field] for field in ("id", "customer", "amount")}
        if order is None:  # the tombstone keeps its row, its decoded columns null
            assert row["value"] is None and decoded == {"id": None, "customer": None, "amount": None}
        else:
            assert decoded == order
    columns = [f.name for f in table_of(config, name).schema().fields]
    assert columns[-3:] == ["id", "customer", "amount"] and REASON not in columns


def test_both_tables_record_their_offsets_and_a_second_pass_adds_nothing(typed, spark):
    config, name, _, _, _ = typed
    ends = asyncio.run(remote_ends(config, name))
    tables = (table_of(config, name), _dead_letters(config, name))
    for table in tables:
        assert table_offsets(table).next_offsets == ends
        assert COMMITTED_OFFSETS in table.current_snapshot().summary.additional_properties
    before = [t.current_snapshot().snapshot_id for t in tables]
    assert_clean(run_pass(config, spark))
    assert [table_of(config, name).current_snapshot().snapshot_id,
            _dead_letters(config, name).current_snapshot().snapshot_id] == before


def test_a_pass_killed_between_the_two_commits_leaves_each_record_once(typed, spark, tmp_path):
    from tierproxy.pipeline.iceberg.append import append_tables

    config, name, records, outcomes, _ = typed
    killed = config.with_overrides({"iceberg.namespace": "killed", "spark.master": "local[1]"})
    # The dead-letter table's commit is the pass's first; the table's, killed, its second.
    result = killed_backfill(killed, name, tmp_path / "tier.properties", at_commit=2)
    assert result.returncode == -9, result.stderr[-3000:]

    dead_before = _dead_letters(killed, name).scan().to_arrow()
    table = table_of(killed, name)
    assert table.current_snapshot() is None and table.scan().to_arrow().num_rows == 0
    write_id = table.properties[PENDING_WRITE]
    leftovers = files_of_write(table, write_id)
    assert leftovers and dead_before.num_rows > 0

    (report,) = append_tables(killed, spark)
    assert report.error is None and report.cleaned == len(leftovers)
    # The table's offsets decided what was read: everything again; no dead letter twice.
    assert report.dead_letters == 0
    assert table_rows(killed, name) == table_rows(config, name)
    assert arrow_rows(_dead_letters(killed, name).scan().to_arrow()) == arrow_rows(dead_before) == arrow_rows(
        _dead_letters(config, name).scan().to_arrow())
    assert files_of_write(table_of(killed, name), write_id) == []
    assert PENDING_WRITE not in table_of(killed, name).properties


def test_status_counts_the_dead_letters(typed, tmp_path, capsys):
    from tierproxy.status import status

    config, name, records, outcomes, _ = typed
    bad = [r for r in _tiered(config, name, records) if _is_dead(outcomes[(r.partition, r.offset)])]
    properties = properties_file(config, tmp_path / "tier.properties")
    assert status(properties, [], as_json=True, timeout=30, out=sys.stdout, err=sys.stderr) == 0
    (table,) = json.loads(capsys.readouterr().out)["iceberg_tables"]
    assert table["table"] == f"kafka.{name}" and table["dead_letters"] == len(bad) > 0
    assert (table["lag_segments"], table["lag_offsets"]) == (0, 0)


def test_an_existing_table_follows_a_newer_schema_or_the_table_step_fails(typed, spark, tmp_path):
    """Last: it changes the module's table."""
    from tierproxy.pipeline.iceberg.append import append_tables

    config, name, _, _, _ = typed
    newer = tmp_path / "newer.avsc"
    newer.write_text(json.dumps({**ORDER, "fields": [*ORDER["fields"],
                                                     {"name": "note", "type": ["null", "string"], "default": None}]}))
    (report,) = append_tables(config.with_overrides({f"topic.{name}.iceberg.value.schema.file": str(newer)}), spark,
                              stream=io.StringIO())
    assert report.error is None
    assert [f.name for f in table_of(config, name).schema().fields][-4:] == ["id", "customer", "amount", "note"]

    changed = tmp_path / "changed.avsc"
    changed.write_text(json.dumps({**ORDER, "fields": [{"name": "id", "type": "string"}, *ORDER["fields"][1:]]}))
    before = table_of(config, name).current_snapshot().snapshot_id
    (report,) = append_tables(config.with_overrides({f"topic.{name}.iceberg.value.schema.file": str(changed)}), spark,
                              stream=io.StringIO())
    assert report.error is not None and "id: type changes from long to string" in report.error
    assert table_of(config, name).current_snapshot().snapshot_id == before


def test_a_topic_of_100_partitions_is_tiered_and_appended(spark, kafka_cluster, tmp_path):
    """A few records per partition, one bad value in every tenth partition."""
    from testbed.fixtures import Topics
    from tests.helpers.iceberg import spark_rows

    partitions = 100
    topics = Topics(kafka_cluster, "iceberg-wide")
    try:
        name = topics(partitions=partitions, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})

        async def produce() -> list[ProducedRecord]:
            producer = AIOKafkaProducer(bootstrap_servers=kafka_cluster.bootstrap_servers, linger_ms=5)
            await producer.start()
            base_ms = int(time.time() * 1000)
            try:
                sent = []
                for partition in range(partitions):
                    for i in range(3):
                        value = b"\x02" if partition % 10 == 0 and i == 1 else _avro(_order(partition, i))
                        future = await producer.send(name, key=b"k", value=value, partition=partition,
                                                     timestamp_ms=base_ms + i)
                        sent.append((future, partition, value, base_ms + i))
                await producer.flush()
                return [ProducedRecord(p, (await f).offset, b"k", v, (), at, True, "wide") for f, p, v, at in sent]
            finally:
                await producer.stop()

        records = asyncio.run(produce())
        asyncio.run(until_older(records, SEGMENT_MS))
        schema = tmp_path / "order.avsc"
        schema.write_text(json.dumps(ORDER))
        config = tier_config(tmp_path, kafka_cluster.bootstrap_servers, name,
                             topic_settings={"segment.ms": SEGMENT_MS, "iceberg.enable": "true",
                                             "iceberg.value.format": "avro", "iceberg.value.schema.file": schema})
        assert_clean(run_pass(config, spark))
        assert asyncio.run(remote_ends(config, name)) == {p: 3 for p in range(partitions)}
        bad = [r for r in records if r.value == b"\x02"]
        good = [r for r in records if r.value != b"\x02"]
        assert len(bad) == 10
        assert table_rows(config, name) == spark_rows(spark, config, name) == expected(good)
        assert arrow_rows(_dead_letters(config, name).scan().to_arrow()) == expected(bad)
        assert table_offsets(table_of(config, name)).next_offsets == {p: 3 for p in range(partitions)}
    finally:
        topics.delete_all()
