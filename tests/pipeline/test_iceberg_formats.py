"""Typed columns (pipeline.iceberg.formats): every Avro and JSON Schema type mapped to its
Iceberg type, good and bad records decoded (a bad one is a null row with a reason, never an
exception), tombstones null without a reason, schema evolution allowed and refused by Iceberg's
rules, and the Schema Registry wire format."""

from __future__ import annotations

import datetime
import io
import json
import struct
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from tierproxy.pipeline.iceberg import formats
from tierproxy.pipeline.iceberg.formats import FormatError, SchemaEvolutionError

UTC = datetime.timezone.utc

AVRO_EVERY_TYPE = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "flag", "type": "boolean"},
        {"name": "count", "type": "int"},
        {"name": "total", "type": "long"},
        {"name": "ratio", "type": "float"},
        {"name": "price", "type": "double"},
        {"name": "blob", "type": "bytes"},
        {"name": "name", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 3}},
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "PAID"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "maybe_tags", "type": {"type": "array", "items": ["null", "long"]}},
        {"name": "attributes", "type": {"type": "map", "values": "long"}},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "id", "type": "long"}, {"name": "email", "type": ["null", "string"]}]}},
        {"name": "billing", "type": "Customer"},  # a named type used again by name
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at_millis", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_micros", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local_at", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "fixed_amount", "type": {"type": "fixed", "name": "Amount", "size": 8, "logicalType": "decimal",
                                          "precision": 12, "scale": 3}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
    ],
}

ORDER = {
    "flag": True, "count": 7, "total": 2**40, "ratio": 0.5, "price": 9.99, "blob": b"\x00\xff", "name": "café",
    "note": None, "code": b"abc", "state": "PAID", "tags": ["a", "b"], "maybe_tags": [1, None],
    "attributes": {"x": 1}, "customer": {"id": 1, "email": "a@b"}, "billing": {"id": 2, "email": None},
    "day": datetime.date(2024, 2, 29),
    "at_millis": datetime.datetime(2024, 1, 2, 3, 4, 5, 6000, tzinfo=UTC),
    "at_micros": datetime.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
    "local_at": datetime.datetime(2024, 1, 2, 3, 4, 5, 1),
    "clock": datetime.time(12, 30, 1, 5000),
    "amount": Decimal("1234.56"), "fixed_amount": Decimal("-1.500"),
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
}


def _types(struct_type: StructType) -> dict[str, Any]:
    return {f.name: (f.field_type, f.required) for f in struct_type.fields}


def _avro(schema: Any, record: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _same_shape(kind: Any, expected: Any) -> bool:
    """Types equal but for field ids (the mapper numbers them itself)."""
    if isinstance(kind, StructType):
        return isinstance(expected, StructType) and [(f.name, f.required) for f in kind.fields] == [
            (f.name, f.required) for f in expected.fields] and all(
            _same_shape(a.field_type, b.field_type) for a, b in zip(kind.fields, expected.fields))
    if isinstance(kind, ListType):
        return (isinstance(expected, ListType) and kind.element_required == expected.element_required
                and _same_shape(kind.element_type, expected.element_type))
    if isinstance(kind, MapType):
        return (isinstance(expected, MapType) and kind.value_required == expected.value_required
                and _same_shape(kind.key_type, expected.key_type) and _same_shape(kind.value_type, expected.value_type))
    return bool(kind == expected)


def test_every_avro_type_maps_to_its_iceberg_type() -> None:
    columns = _types(formats.avro_struct(AVRO_EVERY_TYPE))
    customer = StructType(NestedField(1, "id", LongType(), required=True),
                          NestedField(2, "email", StringType(), required=False))
    expected = {
        "flag": BooleanType(), "count": IntegerType(), "total": LongType(), "ratio": FloatType(),
        "price": DoubleType(), "blob": BinaryType(), "name": StringType(), "note": StringType(),
        "code": FixedType(3), "state": StringType(),
        "tags": ListType(1, StringType(), element_required=True),
        "maybe_tags": ListType(1, LongType(), element_required=False),
        "attributes": MapType(1, StringType(), 2, LongType(), value_required=True),
        "customer": customer, "billing": customer, "day": DateType(), "at_millis": TimestamptzType(),
        "at_micros": TimestamptzType(), "local_at": TimestampType(), "clock": TimeType(),
        "amount": DecimalType(10, 2), "fixed_amount": DecimalType(12, 3), "id": UUIDType(),
    }
    assert list(columns) == list(expected)
    for name, kind in expected.items():
        assert _same_shape(columns[name][0], kind), (name, columns[name][0], kind)
        # Every top-level column is optional: a tombstone or a dead letter fills none of them.
        assert columns[name][1] is False, name
    # Inside a struct, Avro's requiredness stays.
    assert columns["customer"][0].field_by_name("id").required
    assert not columns["customer"][0].field_by_name("email").required
    # Field ids are distinct, as a table schema needs.
    ids = [i for i in formats.avro_struct(AVRO_EVERY_TYPE).fields for i in [i.field_id]]
    assert len(set(ids)) == len(ids)


def test_avro_that_iceberg_cannot_hold_is_refused_at_set_up() -> None:
    with pytest.raises(FormatError, match="no union type"):
        formats.avro_struct({"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "string"]}]})
    with pytest.raises(FormatError, match="contains itself"):
        formats.avro_struct({"type": "record", "name": "Node", "fields": [
            {"name": "next", "type": ["null", "Node"]}]})
    with pytest.raises(FormatError, match="does not define"):
        formats.avro_struct({"type": "record", "name": "R", "fields": [{"name": "x", "type": "Missing"}]})


def test_avro_records_decode_to_typed_columns(tmp_path: Path) -> None:
    schema_file = tmp_path / "order.avsc"
    schema_file.write_text(json.dumps(AVRO_EVERY_TYPE))
    decoder = formats.decoder("orders", "value", "avro", schema_file)
    assert decoder is not None
    good = _avro(AVRO_EVERY_TYPE, ORDER)
    values = pa.array([good, None, b"\x01garbage", good + b"\x00", b""], pa.binary())
    decoded, reasons = decoder.decode(values)
    assert decoded.type == decoder.arrow_type and len(decoded) == len(values)
    rows = decoded.to_pylist()
    assert rows[0] == {**ORDER, "attributes": [("x", 1)]}
    # A tombstone decodes to null, with no reason: it is not a dead letter.
    assert rows[1] is None and reasons[1].as_py() is None
    assert reasons[0].as_py() is None
    for i in (2, 3, 4):
        assert rows[i] is None
        assert reasons[i].as_py().startswith("value: not Avro of its schema"), reasons[i]
    assert "1 bytes left after the record" in reasons[3].as_py()


def test_a_non_record_schema_is_one_column_named_after_its_side() -> None:
    decoder = formats.avro_decoder("key", {"type": "string", "logicalType": "uuid"})
    assert [f.name for f in decoder.struct.fields] == ["key"]
    key = uuid.uuid4()
    decoded, reasons = decoder.decode(pa.array([_avro("string", str(key)), None], pa.binary()))
    assert decoded.to_pylist() == [{"key": key}, None]
    assert reasons.null_count == 2


JSON_EVERY_TYPE = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["id", "amount"],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "amount": {"type": "number"},
        "count": {"type": "integer"},
        "paid": {"type": "boolean"},
        "name": {"type": ["string", "null"]},
        "state": {"enum": ["NEW", "PAID"]},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "clock": {"type": "string", "format": "time"},
        "blob": {"type": "string", "contentEncoding": "base64"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "labels": {"type": "object", "additionalProperties": {"type": "integer"}},
        "customer": {"$ref": "#/$defs/customer"},
        "previous": {"anyOf": [{"$ref": "#/$defs/customer"}, {"type": "null"}]},
    },
    "$defs": {"customer": {"type": "object", "required": ["email"],
                           "properties": {"email": {"type": "string"}, "vip": {"type": "boolean"}}}},
}


def test_every_json_schema_type_maps_to_its_iceberg_type() -> None:
    columns = _types(formats.json_schema_struct(JSON_EVERY_TYPE))
    customer = StructType(NestedField(1, "email", StringType(), required=True),
                          NestedField(2, "vip", BooleanType(), required=False))
    expected = {
        "id": UUIDType(), "amount": DoubleType(), "count": LongType(), "paid": BooleanType(),
        "name": StringType(), "state": StringType(), "at": TimestamptzType(), "day": DateType(),
        "clock": TimeType(), "blob": BinaryType(), "tags": ListType(1, StringType(), element_required=True),
        "labels": MapType(1, StringType(), 2, LongType(), value_required=True),
        "customer": customer, "previous": customer,
    }
    assert list(columns) == list(expected)
    for name, kind in expected.items():
        assert _same_shape(columns[name][0], kind), (name, columns[name][0], kind)
        assert columns[name][1] is False, name


@pytest.mark.parametrize("schema, message", [
    ({"type": "object"}, "needs `properties`"),
    ({"type": "object", "properties": {"x": {"type": ["string", "integer"]}}}, "has 2 non-null types"),
    ({"type": "object", "properties": {"x": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}, "oneOf with 2"),
    ({"type": "object", "properties": {"x": {"type": "array"}}}, "one `items` schema"),
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/n"}},
      "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}}, "contains itself"),
    ({"type": "object", "properties": {"x": {"$ref": "other.json"}}}, "only references inside"),
])
def test_json_schemas_iceberg_cannot_hold_are_refused(schema: dict[str, Any], message: str) -> None:
    with pytest.raises(FormatError, match=message):
        formats.json_schema_struct(schema)


def test_json_values_decode_and_bad_ones_have_reasons(tmp_path: Path) -> None:
    schema_file = tmp_path / "order.schema.json"
    schema_file.write_text(json.dumps(JSON_EVERY_TYPE))
    decoder = formats.decoder("orders", "value", "json", schema_file)
    assert decoder is not None
    order_id = uuid.uuid4()
    good = {
        "id": str(order_id), "amount": 5, "count": 3, "paid": True, "name": None, "state": "NEW",
        "at": "2024-01-02T03:04:05.5Z", "day": "2024-02-29", "clock": "10:11:12", "blob": "AP8=",
        "tags": ["x"], "labels": {"a": 1}, "customer": {"email": "a@b"}, "previous": None, "extra": "ignored",
    }
    bad = [
        b"{not json",
        json.dumps({"amount": 1}).encode(),  # id is required
        json.dumps({"id": str(order_id), "amount": "five"}).encode(),
        json.dumps({"id": str(order_id), "amount": 1, "at": "2024-01-02T03:04:05"}).encode(),  # no offset
        json.dumps({"id": "not-a-uuid", "amount": 1}).encode(),
        json.dumps({"id": str(order_id), "amount": 1, "count": 2**64}).encode(),
        json.dumps([1, 2]).encode(),
        b"\xff\xfe",
    ]
    values = pa.array([json.dumps(good).encode(), None, *bad], pa.binary())
    decoded, reasons = decoder.decode(values)
    rows = decoded.to_pylist()
    assert reasons[0].as_py() is None
    assert rows[0] == {
        "id": order_id, "amount": 5.0, "count": 3, "paid": True, "name": None, "state": "NEW",
        "at": datetime.datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=UTC), "day": datetime.date(2024, 2, 29),
        "clock": datetime.time(10, 11, 12), "blob": b"\x00\xff", "tags": ["x"], "labels": [("a", 1)],
        "customer": {"email": "a@b", "vip": None}, "previous": None,
    }
    assert rows[1] is None and reasons[1].as_py() is None  # tombstone
    texts = [r.as_py() for r in reasons[2:]]
    assert all(row is None for row in rows[2:])
    assert texts[0].startswith("value: not JSON")
    assert "'id' is a required property" in texts[1]
    assert "at $.amount" in texts[2]
    assert "$.at" in texts[3] and "no UTC offset" in texts[3]
    assert "$.id" in texts[4]
    assert "$.count" in texts[5] and "64-bit" in texts[5]
    assert "at $:" in texts[6] and "not of type 'object'" in texts[6]
    assert texts[7].startswith("value: not JSON")


def test_raw_needs_no_decoder_and_formats_are_checked(tmp_path: Path) -> None:
    assert formats.decoder("t", "value", "raw") is None
    with pytest.raises(FormatError, match="json needs a JSON Schema file"):
        formats.decoder("t", "value", "json")
    with pytest.raises(FormatError, match="avro needs an Avro schema file or a schema registry"):
        formats.decoder("t", "key", "avro")
    with pytest.raises(FormatError, match="not one of raw, json, avro"):
        formats.decoder("t", "key", "protobuf")
    missing = tmp_path / "missing.avsc"
    with pytest.raises(FormatError, match=f"topic t key schema file {missing}"):
        formats.decoder("t", "key", "avro", missing)


# --- schema evolution ----------------------------------------------------------------------

V1 = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"},
    {"name": "qty", "type": "int"},
    {"name": "ratio", "type": "float"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "customer", "type": {"type": "record", "name": "C", "fields": [{"name": "email", "type": "string"}]}},
]}


def _with(schema: dict[str, Any], **changes: Any) -> dict[str, Any]:
    fields = [dict(f) for f in schema["fields"]]
    for name, kind in changes.items():
        found = [f for f in fields if f["name"] == name]
        if kind is None:
            fields = [f for f in fields if f["name"] != name]
        elif found:
            found[0]["type"] = kind
        else:
            fields.append({"name": name, "type": kind, **({"default": None} if isinstance(kind, list) else {})})
    return {**schema, "fields": fields}


def test_evolution_adds_optional_columns_and_widens_types() -> None:
    table = Schema(*formats.avro_struct(V1).fields)
    assert not formats.evolve(table, formats.avro_struct(V1))
    newer = _with(V1, qty="long", ratio="double", note=["null", "string"],
                  amount={"type": "bytes", "logicalType": "decimal", "precision": 18, "scale": 2},
                  customer={"type": "record", "name": "C", "fields": [
                      {"name": "email", "type": "string"}, {"name": "phone", "type": ["null", "string"]}]})
    change = formats.evolve(table, formats.avro_struct(newer))
    assert [(path, kind) for path, kind, _ in change.added] == [
        (("customer", "phone"), StringType()), (("note",), StringType())]
    assert dict(change.widened) == {("qty",): LongType(), ("ratio",): DoubleType(), ("amount",): DecimalType(18, 2)}
    # A nested required column becoming optional is allowed too.
    looser = _with(V1, customer={"type": "record", "name": "C", "fields": [
        {"name": "email", "type": ["null", "string"]}]})
    assert formats.evolve(table, formats.avro_struct(looser)).made_optional == (("customer", "email"),)
    # A top-level column the newer schema drops stays (optional): nothing to do.
    assert not formats.evolve(table, formats.avro_struct(_with(V1, ratio=None)))


@pytest.mark.parametrize("change, message", [
    ({"qty": "string"}, "qty: type changes from int to string"),
    ({"id": "int"}, "id: type changes from long to int"),
    ({"amount": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}}, "amount: type changes"),
    ({"customer": {"type": "record", "name": "C", "fields": [
        {"name": "email", "type": "string"}, {"name": "phone", "type": "string"}]}},
     "customer.phone: a new required column cannot be added"),
    ({"customer": {"type": "record", "name": "C", "fields": [{"name": "phone", "type": ["null", "string"]}]}},
     "customer.email: the newer schema drops a required column"),
])
def test_evolution_iceberg_does_not_allow_is_refused(change: dict[str, Any], message: str) -> None:
    table = Schema(*formats.avro_struct(V1).fields)
    with pytest.raises(SchemaEvolutionError, match=message):
        formats.evolve(table, formats.avro_struct(_with(V1, **change)))


# --- the Schema Registry wire format --------------------------------------------------------


def wire(schema_id: int, payload: bytes) -> bytes:
    return struct.pack(">bI", 0, schema_id) + payload


def test_wire_format_header() -> None:
    assert formats.split_wire_format(wire(258, b"xy")) == (258, b"xy")
    for bad in (b"", b"\x00\x00", b"\x01\x00\x00\x00\x01x"):
        with pytest.raises(Exception, match="not the Schema Registry wire format"):
            formats.split_wire_format(bad)


class _Registry(ThreadingHTTPServer):
    """Confluent's schema registry API, the two routes the decoder asks, on 127.0.0.1."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RegistryHandler)
        self.schemas: dict[int, dict[str, Any]] = {}
        self.subjects: dict[str, list[int]] = {}
        self.requests: list[str] = []

    def register(self, subject: str, schema: Any, schema_type: str = "AVRO") -> int:
        schema_id = len(self.schemas) + 1
        self.schemas[schema_id] = {"schema": json.dumps(schema),
                                   **({"schemaType": schema_type} if schema_type != "AVRO" else {})}
        self.subjects.setdefault(subject, []).append(schema_id)
        return schema_id

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _RegistryHandler(BaseHTTPRequestHandler):
    server: _Registry

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.requests.append(self.path)
        parts = self.path.strip("/").split("/")
        body: Any = None
        if parts[:2] == ["schemas", "ids"] and int(parts[2]) in self.server.schemas:
            body = self.server.schemas[int(parts[2])]
        elif parts[0] == "subjects" and parts[2:] == ["versions", "latest"] and parts[1] in self.server.subjects:
            versions = self.server.subjects[parts[1]]
            body = {"subject": parts[1], "version": len(versions), "id": versions[-1],
                    **self.server.schemas[versions[-1]]}
        if body is None:
            self.send_response(404)
            payload = json.dumps({"error_code": 40403, "message": "Schema not found"}).encode()
        else:
            self.send_response(200)
            payload = json.dumps(body).encode()
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def registry() -> Iterator[_Registry]:
    server = _Registry()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_registry_records_decode_with_their_own_schema(registry: _Registry) -> None:
    v1 = {"type": "record", "name": "Payment", "fields": [{"name": "id", "type": "long"},
                                                          {"name": "amount", "type": "double"}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "currency", "type": ["null", "string"], "default": None}]}
    id1 = registry.register("payments-value", v1)
    id2 = registry.register("payments-value", v2)
    json_id = registry.register("other-value", {"type": "object"}, "JSON")
    decoder = formats.decoder("payments", "value", "avro", registry=formats.SchemaRegistry(registry.url))
    assert decoder is not None
    # Without a schema file the table follows the subject's newest schema.
    assert [f.name for f in decoder.struct.fields] == ["id", "amount", "currency"]
    values = pa.array([
        wire(id1, _avro(v1, {"id": 1, "amount": 2.5})),
        wire(id2, _avro(v2, {"id": 2, "amount": 3.5, "currency": "EUR"})),
        None,
        wire(99, _avro(v1, {"id": 3, "amount": 1.0})),  # an id the registry does not know
        wire(id2, b"\x02"),  # bad bytes
        _avro(v1, {"id": 4, "amount": 1.0}),  # no wire header
        wire(json_id, b"{}"),
        wire(id1, _avro(v1, {"id": 5, "amount": 4.0})),
    ], pa.binary())
    decoded, reasons = decoder.decode(values)
    rows, texts = decoded.to_pylist(), reasons.to_pylist()
    assert rows[0] == {"id": 1, "amount": 2.5, "currency": None}  # v1 read as v2: Avro's resolution
    assert rows[1] == {"id": 2, "amount": 3.5, "currency": "EUR"}
    assert rows[7] == {"id": 5, "amount": 4.0, "currency": None}
    assert rows[2] is None and texts[2] is None
    assert texts[:3] == [None, None, None] and texts[7] is None
    assert texts[3] == f"value: schema id 99 is not in the schema registry {registry.url}"
    assert texts[4].startswith("value: not Avro of its schema")
    assert texts[5] == "value: not the Schema Registry wire format (magic byte 0 and a 4-byte schema id)"
    assert texts[6] == f"value: schema id {json_id} is a JSON schema, not Avro"
    assert all(rows[i] is None for i in (3, 4, 5, 6))
    # Each schema is fetched once, however many records use it.
    assert registry.requests.count(f"/schemas/ids/{id1}") <= 1
    assert registry.requests.count(f"/schemas/ids/{id2}") <= 1


def test_a_schema_file_is_the_table_schema_and_writers_resolve_to_it(registry: _Registry, tmp_path: Path) -> None:
    v1 = {"type": "record", "name": "P", "fields": [{"name": "id", "type": "long"}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "note", "type": "string"}]}  # required, no default
    id2 = registry.register("p-value", v2)
    reader_file = tmp_path / "p.avsc"
    reader_file.write_text(json.dumps(v1))
    decoder = formats.decoder("p", "value", "avro", reader_file, registry=formats.SchemaRegistry(registry.url))
    assert decoder is not None
    decoded, reasons = decoder.decode(pa.array([wire(id2, _avro(v2, {"id": 7, "note": "x"}))], pa.binary()))
    assert decoded.to_pylist() == [{"id": 7}] and reasons.to_pylist() == [None]
    # A reader that needs a field the writer lacks (no default): not resolvable, a dead letter.
    decoder = formats.decoder("p", "value", "avro", _write(tmp_path / "v2.avsc", v2),
                              registry=formats.SchemaRegistry(registry.url))
    assert decoder is not None
    id1 = registry.register("p-value", v1)
    decoded, reasons = decoder.decode(pa.array([wire(id1, _avro(v1, {"id": 8}))], pa.binary()))
    assert decoded.to_pylist() == [None]
    assert reasons[0].as_py().startswith("value: not Avro of its schema")


def _write(path: Path, schema: Any) -> Path:
    path.write_text(json.dumps(schema))
    return path


def test_an_unreachable_registry_fails_the_pass_instead_of_dead_lettering(registry: _Registry) -> None:
    v1 = {"type": "record", "name": "P", "fields": [{"name": "id", "type": "long"}]}
    schema_id = registry.register("p-value", v1)
    decoder = formats.decoder("p", "value", "avro", registry=formats.SchemaRegistry(registry.url))
    assert decoder is not None
    registry.shutdown()
    registry.server_close()
    # The records are fine; the registry is not there: the pass fails and is retried, nothing is lost.
    with pytest.raises(formats.SchemaRegistryError, match="could not be asked"):
        decoder.decode(pa.array([wire(schema_id + 1, b"\x02")], pa.binary()))


def test_json_in_the_wire_format(registry: _Registry, tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    schema_id = registry.register("j-value", schema, "JSON")
    decoder = formats.decoder("j", "value", "json", _write(tmp_path / "j.json", schema),
                              registry=formats.SchemaRegistry(registry.url))
    assert decoder is not None
    decoded, reasons = decoder.decode(pa.array([wire(schema_id, b'{"n": 1}'), wire(77, b'{"n": 2}'), b'{"n": 3}'],
                                               pa.binary()))
    assert decoded.to_pylist() == [{"n": 1}, None, None]
    assert reasons.to_pylist()[1:] == [
        f"value: schema id 77 is not in the schema registry {registry.url}",
        "value: not the Schema Registry wire format (magic byte 0 and a 4-byte schema id)"]


def test_a_subject_missing_from_the_registry_is_a_set_up_error(registry: _Registry) -> None:
    with pytest.raises(FormatError, match="has no subject 'absent-key'"):
        formats.decoder("absent", "key", "avro", registry=formats.SchemaRegistry(registry.url))


def test_topic_settings_choose_the_decoders(tmp_path: Path, registry: _Registry) -> None:
    from tierproxy import config as settings

    avsc = _write(tmp_path / "v.avsc", V1)
    registry.register("t-key", "string")
    config = settings.parse({
        "bootstrap.servers": "127.0.0.1:9092",
        "topic.t.iceberg.value.format": "avro", "topic.t.iceberg.value.schema.file": str(avsc),
        "topic.t.iceberg.key.format": "avro", "iceberg.schema.registry.url": registry.url,
    })
    key, value = formats.topic_decoders(config, "t")
    assert key is not None and [f.name for f in key.struct.fields] == ["key"]
    assert value is not None and [f.name for f in value.struct.fields] == [f["name"] for f in V1["fields"]]
    assert formats.topic_decoders(config, "other") == (None, None)  # raw by default
    with pytest.raises(settings.ConfigError, match=r"topic.t.iceberg.value.format=json needs "
                                                   r"topic.t.iceberg.value.schema.file"):
        settings.parse({"bootstrap.servers": "127.0.0.1:9092", "topic.t.iceberg.value.format": "json"})
    with pytest.raises(settings.ConfigError, match=r"topic.t.iceberg.key.format=avro needs .*or "
                                                   r"iceberg.schema.registry.url"):
        settings.parse({"bootstrap.servers": "127.0.0.1:9092", "topic.t.iceberg.key.format": "avro"})
    with pytest.raises(settings.ConfigError, match=r"topic.t.iceberg.key.format='xml': must be one of raw, json, avro"):
        settings.parse({"bootstrap.servers": "127.0.0.1:9092", "topic.t.iceberg.key.format": "xml"})
    # A typed format on a table the pass keeps is taken (the pass writes its columns).
    typed = settings.parse({"bootstrap.servers": "127.0.0.1:9092", "topic.t.iceberg.enable": "true",
                            "topic.t.iceberg.value.format": "avro", "topic.t.iceberg.value.schema.file": str(avsc)})
    assert typed.topic("t").iceberg_enable and typed.topic("t").iceberg_value_format == "avro"


def test_an_unforeseen_error_in_one_record_is_that_records_reason() -> None:
    struct_type = formats.avro_struct("long", "value")

    def decode_one(data: bytes) -> dict[str, Any]:
        return {"value": int(data)}  # ValueError for what is not a number

    decoder = formats.Decoder("value", struct_type, decode_one)
    decoded, reasons = decoder.decode(pa.array([b"12", b"x", None], pa.binary()))
    assert decoded.to_pylist() == [{"value": 12}, None, None]
    assert reasons.to_pylist()[0] is None and reasons.to_pylist()[2] is None
    assert reasons[1].as_py().startswith("value: cannot be read into its columns: ValueError")
    # A value out of its column's range, found only by pyarrow, fails that record alone.
    too_big = formats.Decoder("value", struct_type, lambda data: {"value": 2**70 if data == b"big" else 1})
    decoded, reasons = too_big.decode(pa.array([b"a", b"big", b"c"], pa.binary()))
    assert decoded.to_pylist() == [{"value": 1}, None, {"value": 1}]
    assert reasons[1].as_py().startswith("value: does not fit its columns")


_EVERY_TYPE_DECODERS = {
    "avro": formats.avro_decoder("value", AVRO_EVERY_TYPE),
    "json": formats.json_decoder("value", JSON_EVERY_TYPE),
}
_GOOD = {"avro": _avro(AVRO_EVERY_TYPE, ORDER),
         "json": json.dumps({"id": str(uuid.UUID(int=1)), "amount": 2.5, "at": "2024-01-01T00:00:00+02:00"}).encode()}


@settings(max_examples=150, deadline=None, database=None)
@given(kind=st.sampled_from(sorted(_EVERY_TYPE_DECODERS)),
       # None, any bytes, the good record, or the good record cut at an offset.
       values=st.lists(st.one_of(st.none(), st.binary(max_size=64), st.just(b"good"), st.integers(0, 200)),
                       max_size=12))
def test_any_bytes_decode_or_have_a_reason(kind: str, values: list[Any]) -> None:
    """Whatever the bytes, decode() answers every record: a row, or a reason, or (null) neither."""
    good = _GOOD[kind]
    batch = [good if v == b"good" else good[:v] if isinstance(v, int) else v for v in values]
    decoded, reasons = _EVERY_TYPE_DECODERS[kind].decode(pa.array(batch, pa.binary()))
    assert len(decoded) == len(reasons) == len(batch)
    for data, row, reason in zip(batch, decoded.to_pylist(), reasons.to_pylist()):
        if data is None:
            assert row is None and reason is None
        else:
            assert (row is None) != (reason is None), (data, row, reason)
        if data == good:
            assert row is not None
