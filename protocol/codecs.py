"""kio-based codecs for the APIs the proxy decodes; every other API stays opaque.

Payloads are decoded with kio's native reader and encoded with kio's writer. Record
bytes in Fetch responses stay kio ``Records`` (opaque bytes), never parsed here.

kio's native reader sizes each array from its length field before reading any
element, so a hostile length (say 2**31) makes it allocate gigabytes and abort the
whole process. Before kio sees a payload, a walk over the same schema checks every
length against the bytes that are actually there: nothing is built, only positions
are advanced. Any failure of either step is a DecodeError naming the API and version.

Only kio's public API is used: ``kio.index`` to load schemas, ``kio.serial``'s reader
and writer, and the schemas' own dataclass fields (their annotations and the
``kafka_type`` and ``tag`` metadata, `schema_fields`) for everything else.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import struct
import types
import typing

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import fields
from types import MappingProxyType
from typing import TYPE_CHECKING
from typing import Any

from kio.index import KioIndexError
from kio.index import load_request_schema
from kio.index import load_response_schema
from kio.schema.index import api_key_map
from kio.schema.index import schema_name_map
from kio.serial import entity_reader
from kio.serial import entity_writer
from kio.static.protocol import Entity

from .apis import ApiKey
from .errors import DecodeError
from .errors import FrameError
from .framing import SIZE_PREFIX_BYTES
from .headers import RequestHeader
from .headers import encode_request_header
from .headers import encode_response_header
from .headers import parse_response_header
from .headers import peek_request_header
from .headers import read_unsigned_varint
from .headers import request_header_version
from .headers import response_header_version

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = (
    "INTERCEPTED",
    "decode_request",
    "decode_request_frame",
    "decode_response",
    "decode_response_frame",
    "encode_payload",
    "encode_request",
    "encode_response",
    "kio_versions",
    "make_entity",
    "nested_entities",
    "preload",
    "request_schema",
    "response_schema",
    "schema_fields",
    "SchemaField",
)


def kio_versions(api_key: int, min_version: int = 0) -> range:
    """The versions of an API kio has schemas for, from ``min_version`` on."""
    versions = schema_name_map[api_key_map[api_key]]
    return range(max(min(versions), min_version), max(versions) + 1)


# Fetch below v4 and ListOffsets v0 predate record batches / special timestamps as
# the proxy uses them; clients negotiate newer versions through ApiVersions.
INTERCEPTED: Mapping[ApiKey, range] = MappingProxyType(
    {
        ApiKey.API_VERSIONS: kio_versions(ApiKey.API_VERSIONS),
        ApiKey.METADATA: kio_versions(ApiKey.METADATA),
        ApiKey.FIND_COORDINATOR: kio_versions(ApiKey.FIND_COORDINATOR),
        ApiKey.DESCRIBE_CLUSTER: kio_versions(ApiKey.DESCRIBE_CLUSTER),
        ApiKey.FETCH: kio_versions(ApiKey.FETCH, 4),
        ApiKey.LIST_OFFSETS: kio_versions(ApiKey.LIST_OFFSETS, 1),
        ApiKey.OFFSET_FOR_LEADER_EPOCH: kio_versions(ApiKey.OFFSET_FOR_LEADER_EPOCH),
    }
)


def preload(api_keys: Iterable[ApiKey] = INTERCEPTED) -> None:
    """Import the schemas of the intercepted APIs at every version and build their codecs,
    so that a server pays for it at start-up rather than on its clients' first requests."""
    for api_key in api_keys:
        for version in INTERCEPTED[api_key]:
            for schema in (request_schema(api_key, version), response_schema(api_key, version)):
                _entity_walk(schema)
                _reader(schema)
                _writer(schema)


@functools.cache  # kio resolves the module path anew on every call (~75 us a request)
def _schema(load: Callable[[int, int], type[Entity]], api_key: int, api_version: int) -> type[Entity]:
    try:
        return load(api_key, api_version)
    except KioIndexError as e:
        raise DecodeError(f"no schema for api key {api_key} version {api_version}") from e


def request_schema(api_key: int, api_version: int) -> type[Entity]:
    return _schema(load_request_schema, api_key, api_version)


def response_schema(api_key: int, api_version: int) -> type[Entity]:
    return _schema(load_response_schema, api_key, api_version)


# --- schema fields, from the dataclasses kio generates -------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class SchemaField:
    """One field of a kio schema, as its dataclass field declares it: the annotation
    (nullable, a tuple for an array, a dataclass for a nested entity) and the metadata
    (``kafka_type`` of a primitive, ``tag`` of a tagged field)."""

    name: str
    kafka_type: str | None
    """The primitive's Kafka type ("int32", "string", "records", ...); None for an entity."""
    entity: type[Entity] | None
    """The nested entity's class; None for a primitive."""
    array: bool
    nullable: bool
    """The field itself may be null (for an array: the whole array)."""
    tag: int | None
    """The tag of a tagged field (flexible versions)."""


def _without_none(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None was in it)."""
    if typing.get_origin(annotation) not in (types.UnionType, typing.Union):
        return annotation, False
    args = typing.get_args(annotation)
    others = [arg for arg in args if arg is not types.NoneType]
    if len(others) != 1:
        raise TypeError(f"a union of {annotation} is not a Kafka type")
    return others[0], len(others) != len(args)


@functools.cache
def schema_fields(schema: type[Entity]) -> tuple[SchemaField, ...]:
    """The fields of a kio schema (payload, header or nested entity), in wire order."""
    out = []
    for field in fields(schema):
        annotation, nullable = _without_none(field.type)
        array = typing.get_origin(annotation) is tuple
        if array:
            element, ellipsis = typing.get_args(annotation)
            if ellipsis is not Ellipsis:
                raise TypeError(f"{schema.__name__}.{field.name}: {annotation} is not an array")
            annotation, _ = _without_none(element)
        # A dataclass here is one of kio's entity classes (with __version__ and __flexible__).
        entity = typing.cast("type[Entity]", annotation) if dataclasses.is_dataclass(annotation) else None
        kafka_type = None if entity is not None else field.metadata.get("kafka_type")
        if entity is None and not isinstance(kafka_type, str):
            raise TypeError(f"{schema.__name__}.{field.name}: neither an entity nor a kafka_type")
        tag = field.metadata.get("tag")
        out.append(SchemaField(field.name, kafka_type, entity, array, nullable, None if tag is None else int(tag)))
    return tuple(out)


@functools.cache
def nested_entities(schema: type[Entity]) -> Mapping[str, type[Entity]]:
    """Every entity class a schema nests, at any depth, by class name: the classes a
    filter needs to build a response of the client's version (ListOffsets' topics and
    partitions) without importing the module of each version."""
    found: dict[str, type[Entity]] = {}

    def visit(entity: type[Entity]) -> None:
        for field in schema_fields(entity):
            if field.entity is not None and field.entity.__name__ not in found:
                found[field.entity.__name__] = field.entity
                visit(field.entity)

    visit(schema)
    return MappingProxyType(found)


# --- length check ahead of kio's reader -------------------------------------------

_Walk = Callable[[memoryview, int, int], int]
"""(buffer, position, end) -> position after the value; raises DecodeError."""

_FIXED_SIZE = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


def _underflow(what: str, need: int, pos: int, end: int) -> DecodeError:
    return DecodeError(f"{what} needs {need} bytes at offset {pos}, {max(end - pos, 0)} left")


def _fixed_walk(size: int) -> _Walk:
    def walk(buffer: memoryview, pos: int, end: int) -> int:
        if pos + size > end:
            raise _underflow("field", size, pos, end)
        return pos + size

    return walk


def _legacy_bytes_walk(length_field: struct.Struct) -> _Walk:
    def walk(buffer: memoryview, pos: int, end: int) -> int:
        if pos + length_field.size > end:
            raise _underflow("length", length_field.size, pos, end)
        (length,) = length_field.unpack_from(buffer, pos)
        pos += length_field.size
        # A negative length is null (or garbage kio rejects): no bytes follow.
        if length > 0:
            if pos + length > end:
                raise _underflow("string", length, pos, end)
            pos += length
        return pos

    return walk


def _compact_bytes_walk(buffer: memoryview, pos: int, end: int) -> int:
    length_plus_one, pos = read_unsigned_varint(buffer, pos, end)
    if length_plus_one > 1:
        if pos + length_plus_one - 1 > end:
            raise _underflow("string", length_plus_one - 1, pos, end)
        pos += length_plus_one - 1
    return pos


def _array_walk(element: _Walk | int, flexible: bool) -> _Walk:
    def walk(buffer: memoryview, pos: int, end: int) -> int:
        if flexible:
            count, pos = read_unsigned_varint(buffer, pos, end)
            count -= 1
        else:
            if pos + 4 > end:
                raise _underflow("array length", 4, pos, end)
            (count,) = _INT32.unpack_from(buffer, pos)
            pos += 4
        if count <= 0:
            return pos
        # Every element takes at least one byte; this bounds what kio pre-allocates.
        if count > end - pos:
            raise DecodeError(f"array of {count} elements at offset {pos}, {end - pos} bytes left")
        if isinstance(element, int):
            if pos + count * element > end:
                raise _underflow("array", count * element, pos, end)
            return pos + count * element
        for _ in range(count):
            pos = element(buffer, pos, end)
        return pos

    return walk


def _primitive_walk(kafka_type: str, flexible: bool) -> _Walk | int:
    if kafka_type in _FIXED_SIZE:
        return _FIXED_SIZE[kafka_type]
    if kafka_type not in ("string", "bytes", "records"):
        raise NotImplementedError(f"no length check for kafka type {kafka_type!r}")
    if flexible:
        return _compact_bytes_walk
    return _legacy_bytes_walk(_INT16 if kafka_type == "string" else _INT32)


def _field_walk(field: SchemaField, flexible: bool) -> _Walk | int:
    if field.entity is None:
        assert field.kafka_type is not None
        element = _primitive_walk(field.kafka_type, flexible)
    else:
        # Tagged entities are never null-marked; their presence is the tag (KIP-893).
        element = _entity_walk(field.entity, nullable=field.nullable and not field.array and field.tag is None)
    return _array_walk(element, flexible) if field.array else element


def _as_walk(step: _Walk | int) -> _Walk:
    return _fixed_walk(step) if isinstance(step, int) else step


@functools.cache
def _entity_walk(entity_type: type[Entity], nullable: bool = False) -> _Walk:
    flexible = entity_type.__flexible__
    steps: list[_Walk | int] = []
    tagged: dict[int, _Walk] = {}
    for field in schema_fields(entity_type):
        # Kafka's RequestHeader.json keeps client_id a legacy string in flexible
        # versions too, so that a broker can read it from any request.
        legacy = entity_type.__name__ == "RequestHeader" and field.name == "client_id"
        step = _field_walk(field, flexible and not legacy)
        if field.tag is not None:
            tagged[field.tag] = _as_walk(step)
        elif isinstance(step, int) and steps and isinstance(steps[-1], int):
            steps[-1] += step  # adjacent fixed-size fields are one bounds check
        else:
            steps.append(step)
    body = tuple(_as_walk(step) for step in steps)

    def walk(buffer: memoryview, pos: int, end: int) -> int:
        if nullable:
            if pos >= end:
                raise _underflow("null marker", 1, pos, end)
            (marker,) = _INT8.unpack_from(buffer, pos)
            pos += 1
            if marker < 0:
                return pos
        for step in body:
            pos = step(buffer, pos, end)
        if flexible:
            pos = _tagged_fields_walk(buffer, pos, end, tagged)
        return pos

    return walk


def _tagged_fields_walk(buffer: memoryview, pos: int, end: int, known: dict[int, _Walk]) -> int:
    count, pos = read_unsigned_varint(buffer, pos, end)
    for _ in range(count):
        tag, pos = read_unsigned_varint(buffer, pos, end)
        size, pos = read_unsigned_varint(buffer, pos, end)
        if pos + size > end:
            raise _underflow(f"tagged field {tag}", size, pos, end)
        walk = known.get(tag)
        if walk is not None:
            # A known tag is parsed by kio, so its content is checked too, in its bounds.
            walk(buffer, pos, pos + size)
        pos += size
    return pos


# --- kio codecs ---------------------------------------------------------------------


@functools.cache
def _reader(schema: type[Entity]) -> Callable[[Buffer, int], tuple[Any, int]]:
    return entity_reader(schema)


@functools.cache
def _writer(schema: type[Entity]) -> Callable[[io.BytesIO, Any], None]:
    return entity_writer(schema)


def _decode(schema: type[Entity], payload: Buffer, checked: bool = False) -> Any:
    # kio's native reader refuses writable buffers; frames from FrameDecoder are views
    # of a bytearray, so hand it a read-only view of the same memory (no copy).
    view = memoryview(payload).cast("B").toreadonly()
    what = f"{schema.__name__} v{schema.__version__}"
    try:
        if not checked:
            end = _entity_walk(schema)(view, 0, len(view))
            if end != len(view):
                raise DecodeError(f"{len(view) - end} bytes after the payload")
        value, size = _reader(schema)(view, 0)
    except DecodeError as e:
        raise DecodeError(f"{what}: {e}") from e
    # kio's reader raises its own errors, ValueError (unknown error code),
    # UnicodeDecodeError and others; none may escape as anything but DecodeError.
    except Exception as e:
        raise DecodeError(f"{what}: {type(e).__name__}: {e}") from e
    if size != len(view):
        raise DecodeError(f"{what}: kio read {size} of {len(view)} bytes")
    return value


def decode_request(api_key: int, api_version: int, payload: Buffer, *, checked: bool = False) -> Any:
    """A request payload (the frame body after the request header) as a kio object.

    ``checked``: the caller has already walked the payload's whole structure, refusing
    any array count or length that does not fit the bytes there (as the Fetch session
    check does), so kio reads it without the length walk. That is safe because the walk
    only exists to stop kio allocating from a hostile length: once every count is known
    to fit the payload, what kio allocates is bounded by the payload's size, and kio
    still refuses bytes left over or missing.
    """
    return _decode(request_schema(api_key, api_version), payload, checked)


def decode_response(api_key: int, api_version: int, payload: Buffer) -> Any:
    """A response payload (the frame body after the response header) as a kio object."""
    return _decode(response_schema(api_key, api_version), payload)


def _encode(header: bytes, payload: Entity) -> bytes:
    buffer = io.BytesIO()
    buffer.write(header)
    _writer(type(payload))(buffer, payload)
    return buffer.getvalue()


def encode_request(payload: Any, correlation_id: int, client_id: str | None) -> bytes:
    """Request header and payload, ready for ``encode_frame``."""
    api_key, api_version = payload.__api_key__, payload.__version__
    header_version = request_header_version(api_key, api_version)
    assert header_version is not None, "kio objects always have a schema"
    header = encode_request_header(api_key, api_version, correlation_id, client_id, header_version)
    return _encode(header, payload)


def encode_payload(payload: Any) -> bytes:
    """A kio request or response object as its payload alone, without a header."""
    return _encode(b"", payload)


def encode_response(payload: Any, correlation_id: int) -> bytes:
    """Response header (the version Kafka uses for this API) and payload."""
    header_version = response_header_version(payload.__api_key__, payload.__version__)
    assert header_version is not None, "kio objects always have a schema"
    return _encode(encode_response_header(correlation_id, header_version), payload)


def _frame_body(frame: Buffer) -> memoryview:
    view = memoryview(frame).cast("B")
    if len(view) < SIZE_PREFIX_BYTES:
        raise FrameError(f"truncated frame: {len(view)} of {SIZE_PREFIX_BYTES} size bytes")
    (size,) = _INT32.unpack_from(view, 0)
    if size != len(view) - SIZE_PREFIX_BYTES:
        raise FrameError(f"frame size {size} but {len(view) - SIZE_PREFIX_BYTES} body bytes")
    return view[SIZE_PREFIX_BYTES:]


def decode_request_frame(frame: Buffer) -> tuple[RequestHeader, Any]:
    """A whole request frame (size prefix, header, payload), e.g. a captured one."""
    body = _frame_body(frame)
    header = peek_request_header(body)
    payload = decode_request(header.api_key, header.api_version, body[header.header_size :])
    return header, payload


def decode_response_frame(api_key: int, api_version: int, frame: Buffer) -> tuple[int, Any]:
    """(correlation id, kio object) of a whole response frame to a known request."""
    body = _frame_body(frame)
    header_version = response_header_version(api_key, api_version)
    if header_version is None:
        raise DecodeError(f"no schema for api key {api_key} version {api_version}")
    correlation_id, offset = parse_response_header(body, header_version)
    return correlation_id, decode_response(api_key, api_version, body[offset:])


def make_entity(schema: type[Entity], **values: Any) -> Any:
    """A kio entity of one version from the values of the fields that version has.

    Handlers build responses for many versions at once; fields a version lacks
    (`log_start_offset` before Fetch v5, say) are dropped here.
    """
    names = {f.name for f in fields(schema)}
    return schema(**{name: value for name, value in values.items() if name in names})
