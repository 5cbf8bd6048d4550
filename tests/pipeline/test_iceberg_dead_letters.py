"""Dead letters (pipeline.iceberg.dead_letters): every record of a batch lands in exactly one of
the topic's table (with its decoded columns) and the dead-letter table `<topic>__dlq` (whole and
raw, with the reason), tombstones stay in the table, and both tables take the rows through
Iceberg catalogs (SQL in SQLite, and the real REST catalog from testbed/) and read them back."""

from __future__ import annotations

import datetime
import io
import json
import uuid
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog

from testbed.iceberg_rest import IcebergRestCatalog
from tierproxy.pipeline.iceberg import dead_letters, formats
from tierproxy.pipeline.iceberg.formats import FormatError

UTC = datetime.timezone.utc
HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
# Kafka's columns of a topic's table, as the table's rows carry them.
KAFKA = pa.schema([
    pa.field("partition", pa.int32(), nullable=False), pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")), pa.field("timestamp_type", pa.int8()),
    pa.field("leader_epoch", pa.int32()), pa.field("key", pa.binary()), pa.field("value", pa.binary()),
    pa.field("headers", HEADERS),
])
VALUE_SCHEMA = {
    "type": "object", "required": ["id"],
    "properties": {"id": {"type": "string", "format": "uuid"}, "amount": {"type": "number"},
                   "at": {"type": "string", "format": "date-time"},
                   "tags": {"type": "object", "additionalProperties": {"type": "integer"}},
                   "lines": {"type": "array", "items": {"type": "object", "properties": {
                       "sku": {"type": "string"}, "qty": {"type": "integer"}}}}},
}
KEY_SCHEMA = {"type": "record", "name": "K", "fields": [{"name": "customer", "type": "long"},
                                                        {"name": "region", "type": ["null", "string"]}]}


def _avro(schema: Any, record: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _records() -> tuple[pa.Table, dict[int, str | None]]:
    """A batch of records and, per offset, the reason it is a dead letter (None: it is not)."""
    good_value = json.dumps({"id": str(uuid.UUID(int=7)), "amount": 1.5, "at": "2024-05-06T07:08:09Z",
                             "tags": {"a": 1}, "lines": [{"sku": "x", "qty": 2}]}).encode()
    good_key = _avro(KEY_SCHEMA, {"customer": 42, "region": "eu"})
    cases: list[tuple[bytes | None, bytes | None, str | None]] = [
        (good_key, good_value, None),
        (good_key, None, None),  # a tombstone: kept, value columns null
        (None, good_value, None),  # a null key: kept
        (good_key, b"{oops", "value: not JSON"),
        (b"\x07", good_value, "key: not Avro of its schema"),
        (b"\x07", b"[]", "key: not Avro of its schema"),  # both sides fail: both reasons
        (good_key, json.dumps({"amount": 2}).encode(), "value: does not match the JSON Schema"),
    ]
    at = datetime.datetime(2024, 1, 1, tzinfo=UTC)
    table = pa.table({
        "partition": pa.array([3] * len(cases), pa.int32()),
        "offset": pa.array(range(100, 100 + len(cases)), pa.int64()),
        "timestamp": pa.array([at + datetime.timedelta(seconds=i) for i in range(len(cases))],
                              pa.timestamp("us", tz="UTC")),
        "timestamp_type": pa.array([0] * len(cases), pa.int8()),
        "leader_epoch": pa.array([5] * len(cases), pa.int32()),
        "key": pa.array([c[0] for c in cases], pa.binary()),
        "value": pa.array([c[1] for c in cases], pa.binary()),
        "headers": pa.array([[{"key": "h", "value": bytes([i])}, {"key": "h", "value": None}]
                             for i in range(len(cases))], HEADERS),
    }, schema=KAFKA)
    return table, {100 + i: c[2] for i, c in enumerate(cases)}


def _decoders() -> tuple[formats.Decoder, formats.Decoder]:
    return formats.avro_decoder("key", KEY_SCHEMA), formats.json_decoder("value", VALUE_SCHEMA)


def test_every_record_is_in_the_table_or_a_dead_letter_whole_and_raw() -> None:
    records, expected = _records()
    key, value = _decoders()
    routed = dead_letters.route(records, key, value)
    rows, dead = routed.rows.to_pylist(), routed.dead_letters.to_pylist()
    assert sorted(r["offset"] for r in rows + dead) == sorted(expected)
    assert {r["offset"] for r in rows} == {o for o, reason in expected.items() if reason is None}
    originals = {r["offset"]: r for r in records.to_pylist()}
    for letter in dead:
        offset = letter.pop("offset")
        reason = letter.pop(dead_letters.REASON)
        assert reason.startswith(expected[offset]), (offset, reason)
        # Whole and raw: every Kafka column as it was, headers (duplicate keys, order) included.
        assert {**letter, "offset": offset} == originals[offset]
    both = next(r for r in routed.dead_letters.to_pylist() if r["offset"] == 105)
    assert both["reason"].startswith("key: not Avro") and "; value: does not match the JSON Schema" in both["reason"]
    assert routed.dead_letters.schema == dead_letters.dead_letter_schema(records.schema)

    by_offset = {r["offset"]: r for r in rows}
    assert by_offset[100]["id"] == uuid.UUID(int=7) and by_offset[100]["amount"] == 1.5
    assert by_offset[100]["at"] == datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
    assert by_offset[100]["tags"] == [("a", 1)] and by_offset[100]["lines"] == [{"sku": "x", "qty": 2}]
    assert by_offset[100][dead_letters.KEY_COLUMN] == {"customer": 42, "region": "eu"}
    # The tombstone keeps its key, raw and decoded; its value columns are null.
    assert by_offset[101]["value"] is None and by_offset[101]["id"] is None and by_offset[101]["amount"] is None
    assert by_offset[101][dead_letters.KEY_COLUMN] == {"customer": 42, "region": "eu"}
    assert by_offset[102][dead_letters.KEY_COLUMN] is None and by_offset[102]["id"] == uuid.UUID(int=7)


def test_raw_topics_have_no_dead_letters_and_no_decoded_columns() -> None:
    records, _ = _records()
    routed = dead_letters.route(records, None, None)
    assert routed.rows.equals(records)
    assert routed.dead_letters.num_rows == 0
    assert dead_letters.dead_letter_table("orders") == "orders__dlq"


def test_a_decoder_that_miscounts_is_refused() -> None:
    records, _ = _records()
    short = formats.Decoder("key", formats.avro_struct("long", "key"), lambda data: {"key": 1})
    short.decode = lambda values: (pa.array([None], short.arrow_type), pa.array([None], pa.string()))  # type: ignore[method-assign]
    with pytest.raises(ValueError, match=f"the key decoder returned 1 rows and 1 reasons for {records.num_rows} records"):
        dead_letters.route(records, short, None)


def test_a_decoded_column_named_like_a_kafka_column_is_refused() -> None:
    clash = formats.json_decoder("value", {"type": "object", "properties": {"offset": {"type": "integer"}}})
    with pytest.raises(FormatError, match="decoded column 'offset' has the name of a Kafka column"):
        dead_letters.decoded_fields(KAFKA.names, None, clash)
    records, _ = _records()
    with pytest.raises(FormatError):
        dead_letters.route(records, None, clash)


def _sql_catalog(tmp_path: Path) -> Catalog:
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    return load_catalog("sql", type="sql", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=warehouse.as_uri())


@pytest.mark.parametrize("kind", ["sql", "rest"])
def test_both_tables_take_the_rows_through_a_catalog(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if kind == "rest":
        rest: IcebergRestCatalog = request.getfixturevalue("iceberg_rest_catalog")
        catalog = load_catalog("rest", **rest.client_properties())
    else:
        catalog = _sql_catalog(tmp_path)
    namespace = f"kafka_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    records, _ = _records()
    routed = dead_letters.route(records, *_decoders())
    table = catalog.create_table(f"{namespace}.orders", schema=routed.rows.schema)
    table.append(routed.rows)
    dlq = catalog.create_table(f"{namespace}.{dead_letters.dead_letter_table('orders')}",
                               schema=routed.dead_letters.schema)
    dlq.append(routed.dead_letters)
    expected = routed.rows.sort_by("offset").to_pylist()
    for row in expected:
        # pyiceberg writes a null list of structs as an empty list (apache/iceberg-python#3833):
        # the tombstone's `lines` comes back [].
        if row["lines"] is None:
            row["lines"] = []
    assert table.scan().to_arrow().sort_by("offset").to_pylist() == expected
    assert dlq.scan().to_arrow().sort_by("offset").to_pylist() == routed.dead_letters.sort_by("offset").to_pylist()


def test_a_table_follows_a_newer_schema_and_takes_its_rows(tmp_path: Path) -> None:
    v1 = {"type": "record", "name": "P", "fields": [
        {"name": "id", "type": "int"},
        {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "L", "fields": [
            {"name": "sku", "type": "string"}]}}}]}
    v2 = {"type": "record", "name": "P", "fields": [
        {"name": "id", "type": "long"},
        {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "L", "fields": [
            {"name": "sku", "type": "string"}, {"name": "qty", "type": ["null", "int"], "default": None}]}}},
        {"name": "note", "type": ["null", "string"], "default": None}]}
    catalog = _sql_catalog(tmp_path)
    catalog.create_namespace("kafka")
    records, _ = _records()
    first = records.slice(0, 1).set_column(6, "value", pa.array([_avro(v1, {"id": 1, "lines": [{"sku": "a"}]})]))
    routed = dead_letters.route(first, None, formats.avro_decoder("value", v1))
    table = catalog.create_table("kafka.p", schema=routed.rows.schema)
    table.append(routed.rows)

    newer = formats.avro_decoder("value", v2)
    change = formats.evolve(table.schema(), newer.struct)
    assert [path for path, _, _ in change.added] == [("lines", "element", "qty"), ("note",)]
    formats.apply_evolution(table, change)
    assert not formats.evolve(table.schema(), newer.struct)  # the table now has every column
    second = records.slice(1, 1).set_column(6, "value", pa.array([_avro(v2, {
        "id": 2**40, "lines": [{"sku": "b", "qty": 3}], "note": "n"})]))
    table.append(dead_letters.route(second, None, newer).rows)
    got = {r["offset"]: r for r in table.scan().to_arrow().to_pylist()}
    assert (got[100]["id"], got[100]["lines"], got[100]["note"]) == (1, [{"sku": "a", "qty": None}], None)
    assert (got[101]["id"], got[101]["lines"], got[101]["note"]) == (2**40, [{"sku": "b", "qty": 3}], "n")
