"""Typed columns from Kafka keys and values: `raw`, `json` (checked against a JSON Schema) or
`avro` (an Avro schema file, or the Schema Registry wire format).

A decoder turns one side of the records (keys or values) into a struct of typed columns:
`decode(values) -> (decoded, reasons)`. Row i of `decoded` is null when the record did not
decode, and `reasons[i]` then says why; a null key or value (a tombstone) decodes to a null row
with no reason. Nothing raises for a bad record: the caller sends it, whole and raw, to the
dead-letter table (pipeline.iceberg.dead_letters). Only a schema registry that cannot be
reached raises (`SchemaRegistryError`): the records are fine, the pass is retried later.

The columns' types follow Iceberg's own mapping of Avro (records -> structs, arrays -> lists,
maps, enums -> strings, logical types date, time, timestamp, decimal, uuid) and the closest one
for JSON Schema (`format` date-time, date, time, uuid; `contentEncoding` base64 -> binary). The
decoded top-level columns are all optional, since a tombstone or a dead letter has none.
`evolve()` says how a table's columns follow a newer schema by Iceberg's rules, or refuses.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import functools
import io
import json
import struct
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, cast

import fastavro
import jsonschema
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from tierproxy.config import ICEBERG_FORMATS, ICEBERG_SCHEMA_REGISTRY_URL, Config

FORMATS = ICEBERG_FORMATS
SIDES = ("key", "value")
# Confluent's wire format: magic byte 0, then the schema id as a big-endian int32.
_WIRE_HEADER = struct.Struct(">bI")
REGISTRY_TIMEOUT_S = 10.0


class FormatError(ValueError):
    """A schema that has no Iceberg columns, or a format set up wrong (raised at set-up)."""


class SchemaEvolutionError(ValueError):
    """A newer schema changes the table in a way Iceberg does not allow."""


class SchemaRegistryError(RuntimeError):
    """The schema registry could not be asked (unreachable, or it failed): retry later."""


class _Undecodable(Exception):
    """One record that does not decode; its message is the dead letter's reason."""


# --- the schema registry ------------------------------------------------------------------


@dataclass(frozen=True)
class RegisteredSchema:
    schema_id: int
    schema_type: str  # AVRO, JSON or PROTOBUF, as the registry names them
    text: str


class SchemaRegistry:
    """A Confluent-compatible schema registry (Confluent's, Apicurio's ccompat API, Karapace),
    asked over HTTP; schemas by id are immutable, so each is fetched once."""

    def __init__(self, url: str, *, timeout: float = REGISTRY_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._by_id: dict[int, RegisteredSchema] = {}

    def _get(self, path: str) -> Any | None:
        """The JSON answer to GET `path`; None when the registry says 404 (no such schema)."""
        request = urllib.request.Request(self.url + path, headers={
            "Accept": "application/vnd.schemaregistry.v1+json, application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise SchemaRegistryError(f"schema registry {self.url} answered GET {path} with HTTP {exc.code}: "
                                      f"{exc.read()[:200]!r}") from exc
        except (OSError, ValueError) as exc:
            raise SchemaRegistryError(f"schema registry {self.url} could not be asked for {path}: {exc}") from exc

    def schema(self, schema_id: int) -> RegisteredSchema | None:
        """The schema registered under `schema_id`, None if the registry has none."""
        if schema_id not in self._by_id:
            answer = self._get(f"/schemas/ids/{schema_id}")
            if answer is None:
                return None
            self._by_id[schema_id] = RegisteredSchema(schema_id, answer.get("schemaType", "AVRO"), answer["schema"])
        return self._by_id[schema_id]

    def latest(self, subject: str) -> RegisteredSchema:
        """The newest version of `subject` (the table's schema when no schema file is given)."""
        answer = self._get(f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest")
        if answer is None:
            raise FormatError(f"schema registry {self.url} has no subject {subject!r}: register the topic's "
                              f"schema, or give a schema file")
        registered = RegisteredSchema(answer["id"], answer.get("schemaType", "AVRO"), answer["schema"])
        self._by_id.setdefault(registered.schema_id, registered)
        return registered


def subject(topic: str, side: str) -> str:
    """The registry subject of a topic's keys or values (Confluent's TopicNameStrategy)."""
    return f"{topic}-{side}"


def split_wire_format(data: bytes) -> tuple[int, bytes]:
    """(schema id, payload) of a record in the Schema Registry wire format."""
    if len(data) < _WIRE_HEADER.size or data[0] != 0:
        raise _Undecodable("not the Schema Registry wire format (magic byte 0 and a 4-byte schema id)")
    _, schema_id = _WIRE_HEADER.unpack_from(data)
    return schema_id, data[_WIRE_HEADER.size:]


# --- Avro -> Iceberg ----------------------------------------------------------------------


class _Ids:
    """Field ids in the order a schema names its fields (a table assigns its own on creation)."""

    def __init__(self) -> None:
        self.last = 0

    def __call__(self) -> int:
        self.last += 1
        return self.last


def _avro_logical(schema: Mapping[str, Any]) -> IcebergType | None:
    logical, base = schema.get("logicalType"), schema.get("type")
    if logical == "date" and base == "int":
        return DateType()
    if (logical, base) in (("time-millis", "int"), ("time-micros", "long")):
        return TimeType()
    if logical in ("timestamp-millis", "timestamp-micros") and base == "long":
        return TimestamptzType()  # Avro's timestamps are instants on the UTC time-line
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and base == "long":
        return TimestampType()
    if logical == "decimal" and base in ("bytes", "fixed"):
        return DecimalType(int(schema["precision"]), int(schema.get("scale", 0)))
    if logical == "uuid" and (base == "string" or (base == "fixed" and schema.get("size") == 16)):
        return UUIDType()
    return None  # Avro: an unknown logical type is read as its underlying type


_AVRO_PRIMITIVES: dict[str, IcebergType] = {
    "boolean": BooleanType(), "int": IntegerType(), "long": LongType(), "float": FloatType(),
    "double": DoubleType(), "bytes": BinaryType(), "string": StringType(),
}


class _AvroMapper:
    def __init__(self) -> None:
        self.ids = _Ids()
        self.named: dict[str, Any] = {}  # full name -> schema, for references by name
        self.open: set[str] = set()  # records being mapped: a reference to one is recursion

    def map(self, schema: Any, namespace: str = "") -> tuple[IcebergType, bool]:
        """(Iceberg type, optional?) of an Avro schema."""
        if isinstance(schema, list):
            branches = [b for b in schema if b != "null"]
            if len(branches) != 1:
                raise FormatError(f"the Avro union {json.dumps(schema)} has {len(branches)} non-null branches; "
                                  "Iceberg has no union type (only [\"null\", T] becomes an optional column)")
            return self.map(branches[0], namespace)[0], len(branches) < len(schema)
        if isinstance(schema, str):
            if schema in _AVRO_PRIMITIVES:
                return _AVRO_PRIMITIVES[schema], False
            if schema == "null":
                raise FormatError("an Avro field of type null has no Iceberg column")
            full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
            found = self.named.get(full, self.named.get(schema))
            if found is None:
                raise FormatError(f"the Avro schema names {schema!r}, which it does not define first")
            if (found.get("type") == "record") and (full in self.open or schema in self.open):
                raise FormatError(f"the Avro record {schema!r} contains itself; Iceberg columns cannot recurse")
            return self.map(found, namespace)
        if not isinstance(schema, dict):
            raise FormatError(f"not an Avro schema: {schema!r}")
        logical = _avro_logical(schema)
        if logical is not None:
            return logical, False
        kind = schema.get("type")
        if kind in ("record", "enum", "fixed"):
            name = schema.get("name", "")
            namespace = schema.get("namespace", namespace) if "." not in name else name.rsplit(".", 1)[0]
            full = name if "." in name or not namespace else f"{namespace}.{name}"
            self.named[full] = schema
        if kind == "record":
            self.open.add(full)
            fields = []
            for item in schema.get("fields", []):
                field_id = self.ids()
                field_type, optional = self.map(item["type"], namespace)
                fields.append(NestedField(field_id, item["name"], field_type, required=not optional,
                                          doc=item.get("doc")))
            self.open.discard(full)
            return StructType(*fields), False
        if kind == "enum":
            return StringType(), False
        if kind == "fixed":
            return FixedType(int(schema["size"])), False
        if kind == "array":
            element_id = self.ids()
            element, optional = self.map(schema["items"], namespace)
            return ListType(element_id, element, element_required=not optional), False
        if kind == "map":
            key_id, value_id = self.ids(), self.ids()
            value, optional = self.map(schema["values"], namespace)
            return MapType(key_id, StringType(), value_id, value, value_required=not optional), False
        if isinstance(kind, (str, list, dict)):
            return self.map(kind, namespace)  # {"type": "string"} and the like
        raise FormatError(f"not an Avro schema: {json.dumps(schema)}")


def avro_struct(schema: Any, column: str = "value") -> StructType:
    """The decoded columns of an Avro schema: a record's fields, or one column `column`."""
    return _top_level(_AvroMapper().map(schema)[0], column)[0]


def _top_level(mapped: IcebergType, column: str) -> tuple[StructType, bool]:
    """(the decoded columns, whether the whole key or value is one column `column`)."""
    # Optional at the top: tombstones and dead letters have no decoded columns.
    if isinstance(mapped, StructType):
        return StructType(*(NestedField(f.field_id, f.name, f.field_type, required=False, doc=f.doc)
                            for f in mapped.fields)), False
    # Not a record or object: the whole key or value is the one column, after every nested id.
    return StructType(NestedField(_max_id(mapped) + 1, column, mapped, required=False)), True


def _max_id(kind: IcebergType) -> int:
    if isinstance(kind, StructType):
        return max((max(f.field_id, _max_id(f.field_type)) for f in kind.fields), default=0)
    if isinstance(kind, ListType):
        return max(kind.element_id, _max_id(kind.element_type))
    if isinstance(kind, MapType):
        return max(kind.key_id, kind.value_id, _max_id(kind.value_type))
    return 0


# --- JSON Schema -> Iceberg ---------------------------------------------------------------

_JSON_STRING_FORMATS: dict[str, IcebergType] = {
    "date-time": TimestamptzType(), "date": DateType(), "time": TimeType(), "uuid": UUIDType(),
}


class _JsonSchemaMapper:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.ids = _Ids()
        self.refs: list[str] = []

    def _resolve(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise FormatError(f"$ref {ref!r}: only references inside the schema file (#/...) are followed")
        node: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            part = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise FormatError(f"$ref {ref!r} points at nothing in the schema")
            node = node[part]
        return node

    def map(self, schema: Any, where: str) -> tuple[IcebergType, bool]:
        """(Iceberg type, nullable?) of a JSON Schema; `where` names it in errors."""
        if not isinstance(schema, dict):
            raise FormatError(f"{where}: the schema {schema!r} gives no type")
        if "$ref" in schema:
            ref = schema["$ref"]
            if ref in self.refs:
                raise FormatError(f"{where}: $ref {ref!r} contains itself; Iceberg columns cannot recurse")
            self.refs.append(ref)
            try:
                return self.map(self._resolve(ref), where)
            finally:
                self.refs.pop()
        for combinator in ("anyOf", "oneOf"):
            if combinator in schema:
                options = [s for s in schema[combinator] if s != {"type": "null"}]
                if len(options) != 1:
                    raise FormatError(f"{where}: {combinator} with {len(options)} non-null schemas; an Iceberg "
                                      "column has one type")
                mapped, nullable = self.map(options[0], where)
                return mapped, nullable or len(options) < len(schema[combinator])
        kind = schema.get("type")
        nullable = False
        if isinstance(kind, list):
            types = [t for t in kind if t != "null"]
            nullable = len(types) < len(kind)
            if len(types) != 1:
                raise FormatError(f"{where}: type {kind} has {len(types)} non-null types; an Iceberg column has one")
            kind = types[0]
        if kind is None and "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
            kind = "string"
        if kind == "string":
            if schema.get("contentEncoding") == "base64":
                return BinaryType(), nullable
            return _JSON_STRING_FORMATS.get(schema.get("format", ""), StringType()), nullable
        if kind == "integer":
            return LongType(), nullable
        if kind == "number":
            return DoubleType(), nullable
        if kind == "boolean":
            return BooleanType(), nullable
        if kind == "array":
            if not isinstance(schema.get("items"), dict):
                raise FormatError(f"{where}: an array needs one `items` schema to become an Iceberg list")
            element_id = self.ids()
            element, element_nullable = self.map(schema["items"], f"{where}[]")
            return ListType(element_id, element, element_required=not element_nullable), nullable
        if kind == "object":
            properties = schema.get("properties")
            if properties:
                required = set(schema.get("required", ()))
                fields = []
                for name, sub in properties.items():
                    field_id = self.ids()
                    mapped, sub_nullable = self.map(sub, f"{where}.{name}")
                    fields.append(NestedField(field_id, name, mapped, required=name in required and not sub_nullable,
                                              doc=sub.get("description") if isinstance(sub, dict) else None))
                return StructType(*fields), nullable
            values = schema.get("additionalProperties")
            if isinstance(values, dict):
                key_id, value_id = self.ids(), self.ids()
                mapped, value_nullable = self.map(values, f"{where}{{}}")
                return MapType(key_id, StringType(), value_id, mapped, value_required=not value_nullable), nullable
            raise FormatError(f"{where}: an object needs `properties` (a struct) or an `additionalProperties` "
                              "schema (a map) to have Iceberg columns")
        raise FormatError(f"{where}: type {kind!r} has no Iceberg column (string, integer, number, boolean, "
                          "array or object)")


def json_schema_struct(schema: Mapping[str, Any], column: str = "value") -> StructType:
    """The decoded columns of a JSON Schema: an object's properties, or one column `column`."""
    return _top_level(_JsonSchemaMapper(schema).map(schema, "$")[0], column)[0]


# --- Python values -> Arrow ---------------------------------------------------------------


def _storage_type(arrow_type: pa.DataType) -> pa.DataType:
    """`arrow_type` with extension types (uuid) replaced by their storage: pyarrow builds those
    from Python values, then casts."""
    if isinstance(arrow_type, pa.BaseExtensionType):
        return arrow_type.storage_type
    if pa.types.is_struct(arrow_type):
        return pa.struct([f.with_type(_storage_type(f.type)) for f in arrow_type])
    if pa.types.is_map(arrow_type):
        # Fields, not types, keep the key's and value's field ids (pyarrow takes both; its stubs list types).
        return pa.map_(arrow_type.key_field.with_type(_storage_type(arrow_type.key_type)),  # type: ignore[call-overload]
                       arrow_type.item_field.with_type(_storage_type(arrow_type.item_type)))
    if pa.types.is_large_list(arrow_type):
        return pa.large_list(arrow_type.value_field.with_type(_storage_type(arrow_type.value_type)))
    if pa.types.is_list(arrow_type):
        return pa.list_(arrow_type.value_field.with_type(_storage_type(arrow_type.value_type)))
    return arrow_type


_LONG_RANGE = (-(2**63), 2**63 - 1)
_INT_RANGE = (-(2**31), 2**31 - 1)


def _from_json(kind: IcebergType, value: Any, where: str) -> Any:
    """A JSON value (already checked against the JSON Schema) as pyarrow builds `kind` from."""
    if value is None:
        return None
    try:
        if isinstance(kind, StructType):
            return {f.name: _from_json(f.field_type, value.get(f.name), f"{where}.{f.name}") for f in kind.fields}
        if isinstance(kind, ListType):
            return [_from_json(kind.element_type, v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(kind, MapType):
            return [(k, _from_json(kind.value_type, v, f"{where}.{k}")) for k, v in value.items()]
        if isinstance(kind, LongType):
            if isinstance(value, bool) or not isinstance(value, int) or not _LONG_RANGE[0] <= value <= _LONG_RANGE[1]:
                raise ValueError(f"{value!r} is not a 64-bit integer")
            return value
        if isinstance(kind, DoubleType):
            return float(value)
        if isinstance(kind, TimestamptzType):
            parsed = datetime.datetime.fromisoformat(value)
            if parsed.tzinfo is None:
                raise ValueError(f"{value!r} has no UTC offset (RFC 3339 date-time)")
            return parsed
        if isinstance(kind, DateType):
            return datetime.date.fromisoformat(value)
        if isinstance(kind, TimeType):
            return datetime.time.fromisoformat(value).replace(tzinfo=None)
        if isinstance(kind, UUIDType):
            return uuid.UUID(value).bytes
        if isinstance(kind, BinaryType):
            return base64.b64decode(value, validate=True)
        return value
    except (ValueError, TypeError, AttributeError, binascii.Error) as exc:
        raise _Undecodable(f"{where}: {exc}") from None


def _from_avro(kind: IcebergType, value: Any) -> Any:
    """A value read by fastavro as pyarrow builds `kind` from (maps as pairs, uuids as bytes)."""
    if value is None:
        return None
    if isinstance(kind, StructType):
        return {f.name: _from_avro(f.field_type, value.get(f.name)) for f in kind.fields}
    if isinstance(kind, ListType):
        return [_from_avro(kind.element_type, v) for v in value]
    if isinstance(kind, MapType):
        return [(k, _from_avro(kind.value_type, v)) for k, v in value.items()]
    if isinstance(kind, UUIDType):
        return (value if isinstance(value, uuid.UUID) else uuid.UUID(bytes=value) if isinstance(value, bytes)
                else uuid.UUID(value)).bytes
    if isinstance(kind, TimeType) and isinstance(value, datetime.time):
        return value.replace(tzinfo=None)
    return value


# --- decoders ------------------------------------------------------------------------------


@dataclass
class Decoder:
    """Decodes one side (keys or values) of a topic's records into typed columns."""

    side: str
    struct: StructType
    # One record's bytes -> its decoded row (a dict of the top-level columns), or _Undecodable.
    _decode_one: Callable[[bytes], dict[str, Any]] = field(repr=False)

    @property
    def schema(self) -> Schema:
        """The decoded columns as an Iceberg schema."""
        return Schema(*self.struct.fields)

    @functools.cached_property
    def arrow_type(self) -> pa.StructType:
        return pa.struct(list(schema_to_pyarrow(self.schema)))

    @functools.cached_property
    def _storage(self) -> pa.StructType:
        return cast(pa.StructType, _storage_type(self.arrow_type))

    def decode(self, values: pa.Array) -> tuple[pa.StructArray, pa.StringArray]:
        """(decoded rows, reasons): row i null with reasons[i] saying why when record i did not
        decode; null with no reason for a null key or value."""
        rows: list[dict[str, Any] | None] = []
        reasons: list[str | None] = []
        for data in values.to_pylist():
            if data is None:
                rows.append(None)
                reasons.append(None)
                continue
            try:
                rows.append(self._decode_one(data))
                reasons.append(None)
            except _Undecodable as exc:
                rows.append(None)
                reasons.append(f"{self.side}: {exc}")
            except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
                # A value its columns cannot take that no check above foresaw: still this one record's fault.
                rows.append(None)
                reasons.append(f"{self.side}: cannot be read into its columns: {type(exc).__name__}: {exc}")
        return self._to_arrow(rows, reasons), pa.array(reasons, pa.string())

    def _to_arrow(self, rows: list[dict[str, Any] | None], reasons: list[str | None]) -> pa.StructArray:
        target, storage = self.arrow_type, self._storage
        try:
            return cast(pa.StructArray, pa.array(rows, type=storage).cast(target))
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            pass
        # One row pyarrow refuses (a value out of its column's range) must not fail the others:
        # find it, and make it a dead letter.
        for i, row in enumerate(rows):
            if row is None:
                continue
            try:
                pa.array([row], type=storage)
            except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
                rows[i] = None
                reasons[i] = f"{self.side}: does not fit its columns: {exc}"
        return cast(pa.StructArray, pa.array(rows, type=storage).cast(target))


def _avro_reader(schema: Any) -> Any:
    try:
        return fastavro.parse_schema(schema)
    except Exception as exc:  # noqa: BLE001 - fastavro raises several kinds for a bad schema
        raise FormatError(f"not a valid Avro schema: {exc}") from None


def _read_avro(payload: bytes, writer: Any, reader: Any | None) -> Any:
    buffer = io.BytesIO(payload)
    try:
        record = fastavro.schemaless_reader(buffer, writer, reader)
    except Exception as exc:  # noqa: BLE001 - bad bytes raise EOFError, UnicodeDecodeError, IndexError ...
        raise _Undecodable(f"not Avro of its schema: {type(exc).__name__}: {exc}") from None
    left = len(payload) - buffer.tell()
    if left:
        raise _Undecodable(f"not Avro of its schema: {left} bytes left after the record")
    return record


def _as_row(struct_type: StructType, wrapped: bool, record: Any,
            convert: Callable[[IcebergType, Any], Any]) -> dict[str, Any]:
    if wrapped:
        [column] = struct_type.fields
        return {column.name: convert(column.field_type, record)}
    if not isinstance(record, dict):
        raise _Undecodable(f"not an object: {type(record).__name__}")
    return convert(struct_type, record)


def avro_decoder(side: str, schema: Any | None = None, *, registry: SchemaRegistry | None = None,
                 topic: str = "") -> Decoder:
    """Avro keys or values. With a `registry`, records are in the Schema Registry wire format and
    each is read with the schema of its id, resolved (Avro's rules) to `schema`, or without one,
    to the newest schema of the subject `<topic>-<side>`. Without a registry, records are plain
    Avro binary of `schema`."""
    if schema is None:
        if registry is None:
            raise FormatError(f"{side} format avro needs an Avro schema file or a schema registry")
        latest = registry.latest(subject(topic, side))
        if latest.schema_type != "AVRO":
            raise FormatError(f"subject {subject(topic, side)!r} holds a {latest.schema_type} schema, not Avro")
        schema = json.loads(latest.text)
    struct_type, wrapped = _top_level(_AvroMapper().map(schema)[0], side)
    reader = _avro_reader(schema)

    def convert(kind: IcebergType, value: Any) -> Any:
        return _from_avro(kind, value)

    if registry is None:
        def decode_plain(data: bytes) -> dict[str, Any]:
            return _as_row(struct_type, wrapped, _read_avro(data, reader, None), convert)
        return Decoder(side, struct_type, decode_plain)

    writers: dict[int, Any] = {}

    def decode_wire(data: bytes) -> dict[str, Any]:
        schema_id, payload = split_wire_format(data)
        if schema_id not in writers:
            registered = registry.schema(schema_id)
            if registered is None:
                raise _Undecodable(f"schema id {schema_id} is not in the schema registry {registry.url}")
            if registered.schema_type != "AVRO":
                raise _Undecodable(f"schema id {schema_id} is a {registered.schema_type} schema, not Avro")
            try:
                writers[schema_id] = fastavro.parse_schema(json.loads(registered.text))
            except Exception as exc:  # noqa: BLE001
                raise _Undecodable(f"schema id {schema_id} is not a valid Avro schema: {exc}") from None
        return _as_row(struct_type, wrapped, _read_avro(payload, writers[schema_id], reader), convert)

    return Decoder(side, struct_type, decode_wire)


def json_decoder(side: str, schema: dict[str, Any], *, registry: SchemaRegistry | None = None) -> Decoder:
    """JSON keys or values checked against a JSON Schema. With a `registry`, records carry the
    Schema Registry wire header, whose schema id must be registered."""
    struct_type, wrapped = _top_level(_JsonSchemaMapper(schema).map(schema, "$")[0], side)
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise FormatError(f"not a valid JSON Schema: {exc.message}") from None
    validator = validator_class(schema)

    def convert(kind: IcebergType, value: Any) -> Any:
        return _from_json(kind, value, "$")

    def decode(data: bytes) -> dict[str, Any]:
        if registry is not None:
            schema_id, data = split_wire_format(data)
            if registry.schema(schema_id) is None:
                raise _Undecodable(f"schema id {schema_id} is not in the schema registry {registry.url}")
        try:
            document = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Undecodable(f"not JSON: {exc}") from None
        error = jsonschema.exceptions.best_match(validator.iter_errors(document))
        if error is not None:
            path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
            raise _Undecodable(f"does not match the JSON Schema at {path}: {error.message}")
        return _as_row(struct_type, wrapped, document, convert)

    return Decoder(side, struct_type, decode)


def decoder(topic: str, side: str, fmt: str, schema_file: str | Path = "", *,
            registry: SchemaRegistry | None = None) -> Decoder | None:
    """The decoder of a topic's keys or values (`side`) in format `fmt`; None for raw bytes."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, not {side!r}")
    if fmt == "raw":
        return None
    schema: Any = None
    if schema_file:
        try:
            schema = json.loads(Path(schema_file).read_text())
        except (OSError, ValueError) as exc:
            raise FormatError(f"topic {topic} {side} schema file {schema_file}: {exc}") from None
    try:
        if fmt == "avro":
            return avro_decoder(side, schema, registry=registry, topic=topic)
        if fmt == "json":
            if schema is None:
                raise FormatError("format json needs a JSON Schema file")
            return json_decoder(side, schema, registry=registry)
    except FormatError as exc:
        raise FormatError(f"topic {topic} {side}: {exc}") from None
    raise FormatError(f"topic {topic} {side}: format {fmt!r} is not one of {', '.join(FORMATS)}")


# --- schema evolution ----------------------------------------------------------------------


@dataclass(frozen=True)
class Evolution:
    """What a table does to follow a newer schema: columns to add (optional, at a path), types
    to widen, required columns to make optional. Empty when nothing changes."""

    added: tuple[tuple[tuple[str, ...], IcebergType, str | None], ...] = ()
    widened: tuple[tuple[tuple[str, ...], PrimitiveType], ...] = ()
    made_optional: tuple[tuple[str, ...], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.widened or self.made_optional)


def _promotable(old: IcebergType, new: IcebergType) -> bool:
    """Iceberg's allowed type promotions: int -> long, float -> double, decimal(P, S) -> decimal(P', S), P' > P."""
    if (isinstance(old, IntegerType) and isinstance(new, LongType)) or (
            isinstance(old, FloatType) and isinstance(new, DoubleType)):
        return True
    return (isinstance(old, DecimalType) and isinstance(new, DecimalType) and new.scale == old.scale
            and new.precision > old.precision)


def _walk(old: StructType, new: StructType, path: tuple[str, ...], out: dict[str, list[Any]]) -> None:
    olds = {f.name: f for f in old.fields}
    for added in new.fields:
        where = (*path, added.name)
        existing = olds.get(added.name)
        if existing is None:
            if added.required:
                raise SchemaEvolutionError(f"{'.'.join(where)}: a new required column cannot be added (rows "
                                           "already in the table have no value); make it optional")
            out["added"].append((where, added.field_type, added.doc))
            continue
        _compare(existing, added, where, out)
    new_names = {f.name for f in new.fields}
    for kept in old.fields if path else ():  # the top level also holds Kafka's columns, not the schema's
        if kept.name not in new_names and kept.required:
            raise SchemaEvolutionError(f"{'.'.join((*path, kept.name))}: the newer schema drops a required "
                                       "column; new rows could not fill it")


def _compare(old: NestedField, new: NestedField, where: tuple[str, ...], out: dict[str, list[Any]]) -> None:
    name = ".".join(where)
    if old.required and not new.required:
        out["made_optional"].append(where)
    elif not old.required and new.required:
        pass  # an optional column that the newer schema always fills stays optional
    a, b = old.field_type, new.field_type
    if isinstance(a, StructType) and isinstance(b, StructType):
        _walk(a, b, where, out)
    elif isinstance(a, ListType) and isinstance(b, ListType):
        _compare(a.element_field, b.element_field, (*where, "element"), out)
    elif isinstance(a, MapType) and isinstance(b, MapType):
        if a.key_type != b.key_type:
            raise SchemaEvolutionError(f"{name}: map keys change from {a.key_type} to {b.key_type}")
        _compare(a.value_field, b.value_field, (*where, "value"), out)
    elif a != b:
        if isinstance(b, PrimitiveType) and _promotable(a, b):
            out["widened"].append((where, b))
        else:
            raise SchemaEvolutionError(f"{name}: type changes from {a} to {b}, which Iceberg does not allow "
                                       "(only int -> long, float -> double, a wider decimal)")


def evolve(current: Schema | StructType, newer: StructType) -> Evolution:
    """How a table with columns `current` follows records of the newer schema `newer` (a decoder's
    `struct`), by Iceberg's rules: new optional columns are added (nested ones too), int/float/
    decimal widen, required columns may become optional. Anything else raises
    SchemaEvolutionError, saying what. Top-level columns `newer` does not name (Kafka's, the
    key's, a field the newer schema dropped) stay as they are."""
    old = current.as_struct() if isinstance(current, Schema) else current
    out: dict[str, list[Any]] = {"added": [], "widened": [], "made_optional": []}
    _walk(old, newer, (), out)
    return Evolution(tuple(out["added"]), tuple(out["widened"]), tuple(out["made_optional"]))


def topic_decoders(config: Config, topic: str) -> tuple[Decoder | None, Decoder | None]:
    """(key decoder, value decoder) of a topic by its `topic.<name>.iceberg.*` settings; None
    for raw. Raises FormatError for a schema the table cannot have (at set-up, before any row)."""
    settings = config.topic(topic)
    url = config[ICEBERG_SCHEMA_REGISTRY_URL]
    registry = SchemaRegistry(url) if url else None
    return (decoder(topic, "key", settings.iceberg_key_format, settings.iceberg_key_schema_file, registry=registry),
            decoder(topic, "value", settings.iceberg_value_format, settings.iceberg_value_schema_file,
                    registry=registry))


def apply_evolution(table: Any, change: Evolution, prefix: tuple[str, ...] = ()) -> None:
    """Make `change` to a pyiceberg `table` in one schema update (one new metadata version);
    `prefix` is where the decoded columns sit in the table (the key's under `decoded_key`)."""
    if not change:
        return
    with table.update_schema() as update:
        for path, kind, doc in change.added:
            update.add_column((*prefix, *path), kind, doc=doc)
        for path, wider in change.widened:
            update.update_column((*prefix, *path), field_type=wider)
        for path in change.made_optional:
            update.make_column_optional((*prefix, *path))
