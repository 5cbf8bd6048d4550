"""Request and response headers, read and written without touching the payload.

Request header v1: int16 api key, int16 api version, int32 correlation id, nullable
int16-length client id. v2 (flexible APIs) appends tagged fields; the client id stays
a legacy string so a broker can always read it (RequestHeader.json). Response header
v0 is the int32 correlation id; v1 appends tagged fields. ApiVersions responses always
use header v0, so a client that sent a version the broker does not know can still
read the answer (KIP-511).
"""

from __future__ import annotations

import functools
import struct

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kio.index import KioIndexError
from kio.index import load_request_schema
from kio.index import load_response_schema

from .apis import ApiKey
from .errors import DecodeError

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = (
    "RequestHeader",
    "encode_request_header",
    "encode_response_header",
    "parse_response_header",
    "peek_request_header",
    "read_unsigned_varint",
    "request_header_version",
    "response_header_version",
    "skip_tagged_fields",
)

_FIXED = struct.Struct(">hhih")  # api key, api version, correlation id, client id length
_INT32 = struct.Struct(">i")
_NO_TAGGED_FIELDS = b"\x00"


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_version: int | None
    """1 or 2; None when kio does not know this API version (tagged fields unread)."""
    header_size: int
    """Bytes from the start of the frame body to the start of the payload."""

    @property
    def flexible(self) -> bool | None:
        return None if self.header_version is None else self.header_version == 2


@functools.cache
def request_header_version(api_key: int, api_version: int) -> int | None:
    """1 or 2 as kio's schema for this request says; None if kio does not know it."""
    try:
        schema = load_request_schema(api_key, api_version)
    except KioIndexError:
        return None
    return int(schema.__header_schema__.__version__)


@functools.cache
def response_header_version(api_key: int, api_version: int) -> int | None:
    """0 or 1 as kio's schema for this response says; None if kio does not know it."""
    if api_key == ApiKey.API_VERSIONS:
        return 0
    try:
        schema = load_response_schema(api_key, api_version)
    except KioIndexError:
        return None
    return int(schema.__header_schema__.__version__)


def read_unsigned_varint(buffer: Buffer, pos: int, end: int) -> tuple[int, int]:
    """An unsigned varint (at most 5 bytes, as Kafka's ByteUtils) and the next position."""
    value = 0
    shift = 0
    while True:
        if pos >= end:
            raise DecodeError("truncated varint")
        byte = buffer[pos]  # type: ignore[index]  # a byte buffer (bytes, bytearray, a "B" view)
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 35:
            raise DecodeError("varint longer than 5 bytes")


def skip_tagged_fields(buffer: Buffer, pos: int, end: int) -> int:
    """Position after a tagged field section, none of whose fields is kept."""
    count, pos = read_unsigned_varint(buffer, pos, end)
    for _ in range(count):
        _, pos = read_unsigned_varint(buffer, pos, end)
        size, pos = read_unsigned_varint(buffer, pos, end)
        pos += size
        if pos > end:
            raise DecodeError("truncated tagged field")
    return pos


def peek_request_header(body: Buffer) -> RequestHeader:
    """The header of a request frame body (size prefix removed); payload untouched."""
    view = memoryview(body).cast("B")
    end = len(view)
    if end < _FIXED.size:
        raise DecodeError(f"request header needs {_FIXED.size} bytes, frame has {end}")
    api_key, api_version, correlation_id, client_id_length = _FIXED.unpack_from(view, 0)
    pos = _FIXED.size
    if client_id_length < 0:
        client_id = None
    else:
        if pos + client_id_length > end:
            raise DecodeError(
                f"request header client id needs {client_id_length} bytes, "
                f"frame has {end - pos} (api key {api_key}, version {api_version})"
            )
        try:
            client_id = str(view[pos : pos + client_id_length], "utf-8")
        except UnicodeDecodeError as e:
            raise DecodeError(f"request header client id is not UTF-8: {e}") from e
        pos += client_id_length
    header_version = request_header_version(api_key, api_version)
    if header_version == 2:
        pos = skip_tagged_fields(view, pos, end)
    return RequestHeader(api_key, api_version, correlation_id, client_id, header_version, pos)


def encode_request_header(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, header_version: int
) -> bytes:
    if header_version not in (1, 2):
        raise ValueError(f"request header version must be 1 or 2, got {header_version}")
    if client_id is None:
        client_id_bytes = b""
        length = -1
    else:
        client_id_bytes = client_id.encode()
        length = len(client_id_bytes)
    header = _FIXED.pack(api_key, api_version, correlation_id, length) + client_id_bytes
    return header + _NO_TAGGED_FIELDS if header_version == 2 else header


def encode_response_header(correlation_id: int, header_version: int) -> bytes:
    if header_version not in (0, 1):
        raise ValueError(f"response header version must be 0 or 1, got {header_version}")
    header = _INT32.pack(correlation_id)
    return header + _NO_TAGGED_FIELDS if header_version == 1 else header


def parse_response_header(body: Buffer, header_version: int | None) -> tuple[int, int]:
    """(correlation id, payload offset) of a response frame body."""
    view = memoryview(body).cast("B")
    if len(view) < _INT32.size:
        raise DecodeError(f"response header needs 4 bytes, frame has {len(view)}")
    (correlation_id,) = _INT32.unpack_from(view, 0)
    if header_version == 0:
        return correlation_id, _INT32.size
    if header_version == 1:
        return correlation_id, skip_tagged_fields(view, _INT32.size, len(view))
    raise ValueError(f"response header version must be 0 or 1, got {header_version}")

