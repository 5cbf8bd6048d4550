"""Fetch requests and responses (v4+) on the wire, for the Fetch handler's hot paths, without kio.

kio decodes a response's record bytes into new bytes objects and encodes them by copying
them again; on a fetch of many MB that is most of the proxy's work. Here:

- `scan_fetch_response` checks a broker's response and sums it up (throttle time, error
  code, session id, records size, how many partitions are OFFSET_OUT_OF_RANGE, where its
  tagged fields are) reading only the fixed fields; each partition's error code and the
  byte span it takes in the payload are found only when asked (`ScannedResponse.topics`).
  A response with no OFFSET_OUT_OF_RANGE and no node endpoints goes back to the client as
  it came, never decoded.
- `request_session` reads a request's fetch session (id, epoch) from its fixed fields,
  so that a request the proxy passes through is never decoded either.
- `encode_fetch_response` writes a merged response as a list of buffers for `writelines`:
  the broker's partitions as slices of its payload, the remote partitions' headers packed
  here and their record batches as the reader's memoryview slices, never joined.

The two walks over every partition of every Fetch (`request_session`,
`summarize_response`) have a compiled twin, `tierproxy.protocol._fetch_wire`
(`_fetch_wire.c`), built by `pip install` where a compiler is; it is used unless the
environment sets TIERPROXY_NO_EXTENSIONS (see `extensions`). The Python functions here
are the reference: the same checks, the same DecodeError messages.

Field layout (Kafka's FetchResponse.json): throttle_time_ms; error_code, session_id (v7+);
per topic the name (v4-12) or topic id (v13+); per partition index, error_code,
high_watermark, last_stable_offset, log_start_offset (v5+), aborted_transactions,
preferred_read_replica (v11+), records; v12+ is flexible (compact arrays and strings,
tagged fields after every structure). The request (FetchRequest.json) starts with
replica_id (v0-14), max_wait_ms, min_bytes, max_bytes (v3+), isolation_level (v4+),
session_id and session_epoch (v7+), all fixed-size.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from .apis import ErrorCode
from .errors import DecodeError
from .extensions import compiled
from .headers import read_unsigned_varint, skip_tagged_fields

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ("COMPILED", "OUT_OF_RANGE", "RemotePartition", "ScannedPartition", "ScannedResponse",
           "encode_fetch_response", "request_session", "scan_fetch_response", "summarize_response")

FLEXIBLE_VERSION = 12
TOPIC_ID_VERSION = 13
_NO_TAGGED_FIELDS = b"\x00"

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_HEADER_V7 = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_PARTITION_V4 = struct.Struct(">ihqq")  # partition_index, error_code, high_watermark, last_stable_offset
_PARTITION_V5 = struct.Struct(">ihqqq")  # ... log_start_offset
_INDEX_ERROR = struct.Struct(">ih")  # partition_index, error_code: what the scan keeps
_ABORTED = struct.Struct(">qq")  # producer_id, first_offset
OUT_OF_RANGE = int(ErrorCode.offset_out_of_range)
_SESSION = struct.Struct(">ii")  # session_id, session_epoch
SESSIONLESS = (0, -1)  # KIP-227: session id 0 with the final epoch, a full fetch without a session


class ScannedPartition(NamedTuple):
    partition_index: int
    error_code: int
    records_size: int
    start: int  # the partition's bytes in the payload, tagged fields included
    end: int


#: throttle_time_ms, error_code, session_id, records size, partitions OFFSET_OUT_OF_RANGE,
#: offset of the top-level tagged field section (None before v12)
Summary = tuple[int, int, int, int, int, int | None]


class ScannedResponse:
    """A broker's Fetch response, checked: its summary at once, its partitions when asked."""

    __slots__ = ("throttle_time_ms", "error_code", "session_id", "records_size", "out_of_range", "tagged_fields",
                 "_payload", "_version", "_topics")

    def __init__(self, payload: memoryview, version: int, summary: Summary) -> None:
        self.throttle_time_ms, self.error_code, self.session_id, self.records_size, self.out_of_range, tagged = summary
        #: The response's own tagged field section (flexible versions; node endpoints from v16,
        #: which name brokers), as a slice of the payload; None before v12.
        self.tagged_fields = None if tagged is None else payload[tagged:]
        self._payload = payload
        self._version = version
        self._topics: list[tuple[str | uuid.UUID, list[ScannedPartition]]] | None = None

    @property
    def topics(self) -> list[tuple[str | uuid.UUID, list[ScannedPartition]]]:
        """(topic name, or topic id from v13, [partitions]) in the broker's order, walked
        the first time they are asked for (a partition out of range, fetch-session positions
        to update): a response that goes back as it came needs no object per partition."""
        if self._topics is None:
            topics: list[tuple[str | uuid.UUID, list[ScannedPartition]]] = []
            _walk_response(self._payload, self._version, topics)
            self._topics = topics
        return self._topics

    @property
    def has_tagged_fields(self) -> bool:
        return self.tagged_fields is not None and self.tagged_fields[0] != 0

    @property
    def any_out_of_range(self) -> bool:
        return self.out_of_range > 0


def _need(pos: int, size: int, end: int, what: str, message: str = "Fetch response") -> None:
    if size < 0 or pos + size > end:
        raise DecodeError(f"{message}: {what} needs {size} bytes at offset {pos}, {max(end - pos, 0)} left")


def _read_length(payload: Buffer, pos: int, end: int, flexible: bool, legacy: struct.Struct = _INT32,
                 what: str = "array length", message: str = "Fetch response") -> tuple[int, int]:
    """An array's element count, or a string's or bytes' length (-1 for null), and the
    position after it: an unsigned varint less one in flexible versions, else `legacy`."""
    if flexible:
        count, pos = read_unsigned_varint(payload, pos, end)
        return count - 1, pos
    _need(pos, legacy.size, end, what, message)
    return legacy.unpack_from(payload, pos)[0], pos + legacy.size


def _request_session_py(body: Buffer, version: int) -> tuple[int, int]:
    """(session_id, session_epoch) of a Fetch request body (after the request header),
    SESSIONLESS before v7, once its structure is checked (every length within the body)
    so that a malformed request is refused here, not by the broker. Raises DecodeError."""
    view = memoryview(body)
    end = len(view)
    flexible = version >= FLEXIBLE_VERSION
    pos = 13 if version >= 15 else 17  # replica_id (v0-14), max_wait, min/max bytes, isolation
    session = SESSIONLESS
    if version >= 7:
        _need_request(pos, _SESSION.size, end, version, "session")
        session = _SESSION.unpack_from(view, pos)
        pos += _SESSION.size
    # partition, current_leader_epoch (v9+), fetch_offset, last_fetched_epoch (v12+),
    # log_start_offset (v5+), partition_max_bytes
    partition_size = (4 + (4 if version >= 9 else 0) + 8 + (4 if version >= 12 else 0)
                      + (8 if version >= 5 else 0) + 4)
    topic_count, pos = _request_array(view, pos, end, flexible, version, "topics")
    for _ in range(topic_count):
        pos = _skip_topic(view, pos, end, version, flexible)
        count, pos = _request_array(view, pos, end, flexible, version, "partitions")
        if flexible:  # each partition ends with its own tagged fields
            for _ in range(count):
                _need_request(pos, partition_size, end, version, "partition")
                pos = skip_tagged_fields(view, pos + partition_size, end)
            pos = skip_tagged_fields(view, pos, end)
        else:
            _need_request(pos, count * partition_size, end, version, "partitions")
            pos += count * partition_size
    if version >= 7:
        forgotten, pos = _request_array(view, pos, end, flexible, version, "forgotten topics")
        for _ in range(forgotten):
            pos = _skip_topic(view, pos, end, version, flexible)
            count, pos = _request_array(view, pos, end, flexible, version, "forgotten partitions")
            _need_request(pos, count * 4, end, version, "forgotten partitions")
            pos += count * 4
            if flexible:
                pos = skip_tagged_fields(view, pos, end)
    if version >= 11:
        pos = _skip_string(view, pos, end, version, flexible, "rack id", nullable=True)
    if flexible:
        skip_tagged_fields(view, pos, end)
    return session


def _need_request(pos: int, size: int, end: int, version: int, what: str) -> None:
    _need(pos, size, end, what, f"Fetch request v{version}")


def _request_array(view: memoryview, pos: int, end: int, flexible: bool, version: int,
                   what: str) -> tuple[int, int]:
    count, pos = _read_length(view, pos, end, flexible, _INT32, what, f"Fetch request v{version}")
    if count < 0 or count > end - pos:  # null is not allowed; every element takes a byte at least
        raise DecodeError(f"Fetch request v{version}: {what} count {count} at offset {pos}")
    return count, pos


def _skip_topic(view: memoryview, pos: int, end: int, version: int, flexible: bool) -> int:
    """Past a topic id (v13+) or name."""
    if version >= TOPIC_ID_VERSION:
        _need_request(pos, 16, end, version, "topic id")
        return pos + 16
    return _skip_string(view, pos, end, version, flexible, "topic name")


def _skip_string(view: memoryview, pos: int, end: int, version: int, flexible: bool, what: str,
                 nullable: bool = False) -> int:
    """Past a (compact, from v12) string; null only where `nullable`."""
    length, pos = _read_length(view, pos, end, flexible, _INT16, what, f"Fetch request v{version}")
    if nullable and length == -1:
        return pos
    _need_request(pos, length, end, version, what)
    return pos + length


def scan_fetch_response(payload: Buffer, version: int) -> ScannedResponse:
    """A Fetch response (v4+) payload, checked and summed up; its partitions' error codes,
    records sizes and byte spans are found when `topics` is first read. Raises DecodeError
    when the payload is not one."""
    view = memoryview(payload)
    return ScannedResponse(view, version, summarize_response(view, version))


def _summarize_response_py(payload: Buffer, version: int) -> Summary:
    """The summary of a Fetch response payload, once its structure is checked (every
    length within it, topic names UTF-8, nothing after it). Raises DecodeError."""
    return _walk_response(memoryview(payload), version, None)


def _walk_response(view: memoryview, version: int,
                   topics: list[tuple[str | uuid.UUID, list[ScannedPartition]]] | None) -> Summary:
    """The walk behind the summary, which also appends every topic and its partitions to
    `topics` unless it is None."""
    end = len(view)
    flexible = version >= FLEXIBLE_VERSION
    if version >= 7:
        _need(0, 10, end, "header")
        throttle, error, session = _HEADER_V7.unpack_from(view, 0)
        pos = 10
    else:
        _need(0, 4, end, "throttle time")
        throttle, error, session, pos = _INT32.unpack_from(view, 0)[0], 0, 0, 4
    partition_struct = _PARTITION_V5 if version >= 5 else _PARTITION_V4
    records_size = out_of_range = 0
    topic_count, pos = _read_length(view, pos, end, flexible)
    for _ in range(max(topic_count, 0)):
        if version >= TOPIC_ID_VERSION:
            _need(pos, 16, end, "topic id")
            key: str | uuid.UUID = uuid.UUID(bytes=bytes(view[pos:pos + 16]))
            pos += 16
        else:
            length, pos = _read_length(view, pos, end, flexible, _INT16, "topic name length")
            _need(pos, max(length, 0), end, "topic name")
            try:
                key = str(view[pos:pos + max(length, 0)], "utf-8")
            except UnicodeDecodeError:
                raise DecodeError(f"Fetch response: topic name at offset {pos} is not UTF-8") from None
            pos += max(length, 0)
        partitions: list[ScannedPartition] | None = None
        if topics is not None:
            partitions = []
            topics.append((key, partitions))
        partition_count, pos = _read_length(view, pos, end, flexible)
        fixed = partition_struct.size
        for _ in range(max(partition_count, 0)):
            start = pos
            _need(pos, fixed + 1, end, "partition")
            index, error_code = _INDEX_ERROR.unpack_from(view, pos)
            pos += fixed
            # A single byte is the common case (500 partitions a response at the tail).
            if flexible and view[pos] < 0x80:
                aborted, pos = view[pos] - 1, pos + 1
            else:
                aborted, pos = _read_length(view, pos, end, flexible)
            if aborted > 0:
                if flexible:  # each entry ends with its own tagged fields
                    for _ in range(aborted):
                        _need(pos, _ABORTED.size, end, "aborted transaction")
                        pos = skip_tagged_fields(view, pos + _ABORTED.size, end)
                else:
                    _need(pos, aborted * _ABORTED.size, end, "aborted transactions")
                    pos += aborted * _ABORTED.size
            if version >= 11:
                _need(pos, 4, end, "preferred read replica")
                pos += 4
            size, pos = _read_length(view, pos, end, flexible)  # records: bytes, same length encoding
            size = max(size, 0)
            _need(pos, size, end, "records")
            pos += size
            if flexible:
                if pos < end and view[pos] == 0:
                    pos += 1
                else:
                    pos = skip_tagged_fields(view, pos, end)
            records_size += size
            out_of_range += error_code == OUT_OF_RANGE
            if partitions is not None:
                partitions.append(ScannedPartition(index, error_code, size, start, pos))
        if flexible:
            pos = skip_tagged_fields(view, pos, end)
    tagged = None
    if flexible:
        tagged, pos = pos, skip_tagged_fields(view, pos, end)
    if pos != end:
        raise DecodeError(f"Fetch response: {end - pos} bytes after the payload")
    return throttle, error, session, records_size, out_of_range, tagged


# ---------------------------------------------------------------------- encoding


class RemotePartition(NamedTuple):
    """A partition the proxy answers itself."""

    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    #: (producer id, first offset); None is null (READ_UNCOMMITTED)
    aborted_transactions: Sequence[tuple[int, int]] | None
    #: whole record batches, written as they are
    records: Sequence[Buffer]
    records_size: int


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length(count: int, flexible: bool) -> bytes:
    """An array, string or bytes length; -1 is null."""
    if flexible:
        return _uvarint(count + 1)
    return _INT32.pack(count)


def encode_fetch_response(
    version: int,
    topics: Sequence[tuple[str | uuid.UUID, Sequence[RemotePartition | Buffer]]],
    *,
    throttle_time_ms: int = 0,
    error_code: int = 0,
    session_id: int = 0,
    tagged_fields: Buffer = _NO_TAGGED_FIELDS,
) -> list[Buffer]:
    """A Fetch response payload as buffers for `writelines`. A partition is either a
    RemotePartition or the bytes of one the broker encoded at the same version (a
    `ScannedPartition` span of its payload). `tagged_fields` is the response's own tagged
    field section (flexible versions)."""
    flexible = version >= FLEXIBLE_VERSION
    parts: list[Buffer] = []
    head = bytearray()
    if version >= 7:
        head += _HEADER_V7.pack(throttle_time_ms, error_code, session_id)
    else:
        head += _INT32.pack(throttle_time_ms)
    head += _length(len(topics), flexible)
    for key, partitions in topics:
        if version >= TOPIC_ID_VERSION:
            head += key.bytes  # type: ignore[union-attr]  # topics go by id from TOPIC_ID_VERSION on
        else:
            name = str(key).encode()
            head += _uvarint(len(name) + 1) if flexible else _INT16.pack(len(name))
            head += name
        head += _length(len(partitions), flexible)
        for partition in partitions:
            if not isinstance(partition, RemotePartition):
                parts.append(bytes(head))
                head.clear()
                parts.append(partition)
                continue
            fields = (partition.partition_index, partition.error_code, partition.high_watermark,
                      partition.last_stable_offset)
            if version >= 5:
                head += _PARTITION_V5.pack(*fields, partition.log_start_offset)
            else:
                head += _PARTITION_V4.pack(*fields)
            aborted = partition.aborted_transactions
            if aborted is None:
                head += _length(-1, flexible)
            else:
                head += _length(len(aborted), flexible)
                for producer_id, first_offset in aborted:
                    head += _ABORTED.pack(producer_id, first_offset)
                    if flexible:
                        head += _NO_TAGGED_FIELDS
            if version >= 11:
                head += _INT32.pack(-1)  # preferred_read_replica: none
            head += _length(partition.records_size, flexible)
            if partition.records_size:
                parts.append(bytes(head))
                head.clear()
                parts.extend(partition.records)
            if flexible:
                head += _NO_TAGGED_FIELDS
        if flexible:
            head += _NO_TAGGED_FIELDS
    if flexible:
        head += tagged_fields
    parts.append(bytes(head))
    return parts


# ---------------------------------------------------------------------- the compiled twins

_compiled = compiled("tierproxy.protocol._fetch_wire")
#: Whether `request_session` and `summarize_response` are the compiled ones.
COMPILED = _compiled is not None
if _compiled is not None:
    request_session = _compiled.request_session
    summarize_response = _compiled.summarize_response
else:
    request_session = _request_session_py
    summarize_response = _summarize_response_py
