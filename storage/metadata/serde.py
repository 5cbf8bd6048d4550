"""The remote log metadata record format, byte for byte as Kafka's `RemoteLogMetadataSerde`.

A record value is Kafka's `AbstractApiMessageSerde` frame:

    frame version (unsigned varint, always 1)
    api key       (unsigned varint: 0 segment, 1 segment update, 2 partition delete)
    version       (unsigned varint)
    payload       (Kafka protocol encoding of the schema; flexible from version 0:
                   compact strings, compact arrays, a tagged-field section after every struct)

Schemas: `storage/src/main/resources/message/RemoteLogSegmentMetadataRecord.json`,
`RemoteLogSegmentMetadataUpdateRecord.json` and `RemotePartitionDeleteMetadataRecord.json`.
We write version 0, the only version Kafka 4.3 knows; we read versions 0 and 1 (the
later schemas add tagged `BrokerLeaderEpoch` and `EndOffset` fields).

Field mapping. Kafka's records carry `BrokerId` where our metadata carries `leader_epoch`,
the epoch of the writer (the field was `LeaderEpoch` in KIP-405's own schema). We write
`leader_epoch` into `BrokerId`; reading a version 1 record, a present `BrokerLeaderEpoch`
tag wins over `BrokerId`. `CustomMetadata` is written null and ignored on read (our
metadata has no such field). `TxnIndexEmpty` maps to `txn_index_empty`.

One record type is ours: api key 100, `RemoteLogTruncation` (see its docstring). Kafka's
own manager does not know it; it only ever appears in our stores.

Length-prefixed entries (`encode_entry` / `iter_entries`) are seed 003's flat-file
entries: unsigned varint length of the record, then the record.
"""

from __future__ import annotations

import io
import struct
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeAlias, TypeVar

from kio.serial import readers as r
from kio.serial import writers as w
from kio.serial.errors import DecodeError
from kio.static.primitive import i8, i32, i64, uvarint

from ..errors import RemoteLogMetadataError
from ..model import (RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate,
                     RemoteLogSegmentState, RemotePartitionDeleteMetadata, RemotePartitionDeleteState,
                     TopicIdPartition)

FRAME_VERSION = 1
SEGMENT_METADATA_API_KEY = 0
SEGMENT_METADATA_UPDATE_API_KEY = 1
PARTITION_DELETE_API_KEY = 2
SNAPSHOT_API_KEY = 3  # Kafka's snapshot files only, never on the topic; not decoded here
TRUNCATION_API_KEY = 100

WRITE_VERSION = 0
_READ_VERSIONS = (0, 1)
_T = TypeVar("_T")
_ZERO_UUID = uuid.UUID(int=0)
_ZERO_UUID_BYTES = bytes(16)


class MetadataDecodeError(RemoteLogMetadataError):
    """Bytes that are not a valid remote log metadata record."""


@dataclass(frozen=True, slots=True)
class RemoteLogTruncation:
    """The remote log of a partition diverged from the leader's lineage at `truncation_offset`.

    Applied to the segments known when it is read (KIP-405: record truncation offsets in
    the metadata instead of rewriting segments): a segment ending below the offset is
    kept; one starting at or above it goes to DELETE_SEGMENT_STARTED; one straddling it
    is served only below it (its end offset becomes `truncation_offset - 1`). Segments
    added later, by the new lineage, are not affected.
    """

    topic_id_partition: TopicIdPartition
    truncation_offset: int
    leader_epoch: int
    event_timestamp_ms: int

    def __post_init__(self) -> None:
        if self.truncation_offset < 0:
            raise ValueError(f"negative truncation offset {self.truncation_offset} for {self.topic_id_partition}")


RemoteLogMetadata: TypeAlias = (
    RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate | RemotePartitionDeleteMetadata | RemoteLogTruncation
)


def topic_id_partition_of(record: RemoteLogMetadata) -> TopicIdPartition:
    if isinstance(record, (RemoteLogSegmentMetadata,)):
        return record.topic_id_partition
    if isinstance(record, RemoteLogSegmentMetadataUpdate):
        return record.segment_id.topic_id_partition
    return record.topic_id_partition


# ---------------------------------------------------------------------------- writing


def _write_topic_id_partition(buf: io.BytesIO, tp: TopicIdPartition) -> None:
    w.write_compact_string(buf, tp.topic)
    w.write_uuid(buf, tp.topic_id)
    w.write_int32(buf, i32(tp.partition))
    w.write_empty_tagged_fields(buf)


def _write_segment_id(buf: io.BytesIO, segment_id: RemoteLogSegmentId) -> None:
    _write_topic_id_partition(buf, segment_id.topic_id_partition)
    w.write_uuid(buf, segment_id.id)
    w.write_empty_tagged_fields(buf)


def _write_segment(buf: io.BytesIO, m: RemoteLogSegmentMetadata) -> None:
    _write_segment_id(buf, m.segment_id)
    w.write_int64(buf, i64(m.start_offset))
    w.write_int64(buf, i64(m.end_offset))
    w.write_int32(buf, i32(m.leader_epoch))  # BrokerId
    w.write_int64(buf, i64(m.max_timestamp_ms))
    w.write_int64(buf, i64(m.event_timestamp_ms))
    w.write_compact_array_length(buf, len(m.segment_leader_epochs))
    for epoch, offset in m.segment_leader_epochs:
        w.write_int32(buf, i32(epoch))
        w.write_int64(buf, i64(offset))
        w.write_empty_tagged_fields(buf)
    w.write_int32(buf, i32(m.segment_size_in_bytes))
    w.write_nullable_compact_string(buf, None)  # CustomMetadata: null
    w.write_int8(buf, i8(int(m.state)))
    # Tagged field 0 (TxnIndexEmpty, default false) is written only when set, as Kafka does.
    if m.txn_index_empty:
        w.write_unsigned_varint(buf, uvarint(1))
        w.write_unsigned_varint(buf, uvarint(0))
        w.write_unsigned_varint(buf, uvarint(1))
        w.write_boolean(buf, True)
    else:
        w.write_empty_tagged_fields(buf)


def _write_update(buf: io.BytesIO, u: RemoteLogSegmentMetadataUpdate) -> None:
    _write_segment_id(buf, u.segment_id)
    w.write_int32(buf, i32(u.leader_epoch))  # BrokerId
    w.write_int64(buf, i64(u.event_timestamp_ms))
    w.write_nullable_compact_string(buf, None)  # CustomMetadata: null
    w.write_int8(buf, i8(int(u.state)))
    w.write_empty_tagged_fields(buf)


def _write_partition_delete(buf: io.BytesIO, d: RemotePartitionDeleteMetadata) -> None:
    _write_topic_id_partition(buf, d.topic_id_partition)
    w.write_int32(buf, i32(d.epoch))  # BrokerId
    w.write_int64(buf, i64(d.event_timestamp_ms))
    w.write_int8(buf, i8(int(d.state)))
    w.write_empty_tagged_fields(buf)


def _write_truncation(buf: io.BytesIO, t: RemoteLogTruncation) -> None:
    _write_topic_id_partition(buf, t.topic_id_partition)
    w.write_int32(buf, i32(t.leader_epoch))
    w.write_int64(buf, i64(t.event_timestamp_ms))
    w.write_int64(buf, i64(t.truncation_offset))
    w.write_empty_tagged_fields(buf)


# Each writer takes the record type it is filed under.
_WRITERS: dict[type, tuple[int, Callable[[io.BytesIO, Any], None]]] = {
    RemoteLogSegmentMetadata: (SEGMENT_METADATA_API_KEY, _write_segment),
    RemoteLogSegmentMetadataUpdate: (SEGMENT_METADATA_UPDATE_API_KEY, _write_update),
    RemotePartitionDeleteMetadata: (PARTITION_DELETE_API_KEY, _write_partition_delete),
    RemoteLogTruncation: (TRUNCATION_API_KEY, _write_truncation),
}


def serialize(record: RemoteLogMetadata) -> bytes:
    try:
        api_key, write = _WRITERS[type(record)]
    except KeyError:
        raise TypeError(f"not a remote log metadata record: {type(record).__name__}") from None
    buf = io.BytesIO()
    w.write_unsigned_varint(buf, uvarint(FRAME_VERSION))
    w.write_unsigned_varint(buf, uvarint(api_key))
    w.write_unsigned_varint(buf, uvarint(WRITE_VERSION))
    write(buf, record)
    return buf.getvalue()


# ---------------------------------------------------------------------------- reading


def _uuid_of(raw: bytes) -> uuid.UUID:
    """Kafka's zero uuid as the one object, the rest as read."""
    return _ZERO_UUID if raw == _ZERO_UUID_BYTES else uuid.UUID(bytes=raw)


_NO_TAGS: Mapping[int, Any] = MappingProxyType({})


class _Reader:
    """A cursor over one record. Fixed-size fields are read with `struct` (several at once where
    the schema puts them side by side), the rest with kio's native readers, which return
    (value, bytes consumed); a field that runs past the end raises."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        self.pos = 0

    def read(self, reader: r.Reader[_T]) -> _T:
        value, size = reader(self.data, self.pos)
        self.pos += size
        return value

    def fixed(self, layout: struct.Struct) -> tuple:
        values = layout.unpack_from(self.data, self.pos)
        self.pos += layout.size
        return values

    def uvarint(self) -> int:
        data, pos = self.data, self.pos
        if pos < len(data) and data[pos] < 0x80:  # nearly every varint here: one byte
            self.pos = pos + 1
            return data[pos]
        return self.read(r.read_unsigned_varint)

    def int8(self) -> int:
        return self.fixed(_INT8)[0]

    def int32(self) -> int:
        return self.fixed(_INT32)[0]

    def int64(self) -> int:
        return self.fixed(_INT64)[0]

    def boolean(self) -> bool:
        return self.read(r.read_boolean)

    def uuid_bytes(self) -> bytes:
        end = self.pos + 16
        if end > len(self.data):
            raise MetadataDecodeError("a uuid runs past the end of the record")
        raw = bytes(self.data[self.pos:end])
        self.pos = end
        return raw

    def uuid(self) -> uuid.UUID:
        return _uuid_of(self.uuid_bytes())

    def skip(self, size: int) -> None:
        if self.pos + size > len(self.data):
            raise MetadataDecodeError("tagged field runs past the end of the record")
        self.pos += size

    def tagged_fields(self, known: Mapping[int, Callable[[_Reader], int]] = _NO_TAGS) -> Mapping[int, int]:
        """Reads a tagged-field section: the values of the known tags present; unknown ones skipped."""
        count = self.uvarint()
        if not count:
            return _NO_TAGS
        values = {}
        for _ in range(count):
            tag = self.uvarint()
            size = self.uvarint()
            end = self.pos + size
            if tag in known:
                values[tag] = known[tag](self)
                if self.pos != end:
                    raise MetadataDecodeError(f"tagged field {tag} has size {size} but decoded {self.pos - end + size}")
            else:
                self.skip(size)
        return values


_INT8 = struct.Struct(">b")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
# RemoteLogSegmentMetadataRecord: StartOffset, EndOffset, BrokerId, MaxTimestampMs, EventTimestampMs
_SEGMENT_FIELDS = struct.Struct(">qqiqq")
_EPOCH_ENTRY = struct.Struct(">iq")  # LeaderEpoch, Offset
_BROKER_EVENT = struct.Struct(">iq")  # BrokerId, EventTimestampMs
# Every record names its partition: one TopicIdPartition per (name, id, partition), not one per
# record, which also keeps a replay from holding a million equal copies.
_partitions: dict[tuple[str, bytes, int], TopicIdPartition] = {}
_MAX_PARTITIONS_KEPT = 65536


def _read_topic_id_partition(rd: _Reader) -> TopicIdPartition:
    name = rd.read(r.read_compact_string)
    raw_id = rd.uuid_bytes()
    partition = rd.int32()
    rd.tagged_fields()
    key = (name, raw_id, partition)
    tp = _partitions.get(key)
    if tp is None:
        if len(_partitions) >= _MAX_PARTITIONS_KEPT:
            _partitions.clear()
        tp = _partitions[key] = TopicIdPartition(_uuid_of(raw_id), name, partition)
    return tp


def _read_segment_id(rd: _Reader) -> RemoteLogSegmentId:
    tp = _read_topic_id_partition(rd)
    segment_uuid = rd.uuid()
    rd.tagged_fields()
    return RemoteLogSegmentId(tp, segment_uuid)


def _segment_state(value: int) -> RemoteLogSegmentState:
    try:
        return _SEGMENT_STATES[value]
    except KeyError:
        raise MetadataDecodeError(f"unknown remote log segment state id {value}") from None


_SEGMENT_STATES = {int(state): state for state in RemoteLogSegmentState}
# Tagged fields by version: 0 TxnIndexEmpty; from version 1, 1 BrokerLeaderEpoch.
_SEGMENT_TAGS = {0: MappingProxyType({0: _Reader.boolean}),
                 1: MappingProxyType({0: _Reader.boolean, 1: _Reader.int32})}
# Update and partition delete records, from version 1: 0 BrokerLeaderEpoch, 1 EndOffset (not kept).
_EPOCH_END_TAGS = {0: _NO_TAGS, 1: MappingProxyType({0: _Reader.int32, 1: _Reader.int64})}


def _read_segment(rd: _Reader, version: int) -> RemoteLogSegmentMetadata:
    segment_id = _read_segment_id(rd)
    start_offset, end_offset, broker_id, max_timestamp_ms, event_timestamp_ms = rd.fixed(_SEGMENT_FIELDS)
    count = rd.read(r.read_compact_array_length)
    if count is None:
        raise MetadataDecodeError("null SegmentLeaderEpochs")
    epochs: dict[int, int] = {}
    for _ in range(count):
        epoch, offset = rd.fixed(_EPOCH_ENTRY)
        epochs[epoch] = offset
        rd.tagged_fields()
    if len(epochs) != count:
        raise MetadataDecodeError("duplicate leader epoch in SegmentLeaderEpochs")
    size = rd.int32()
    rd.read(r.read_compact_string_as_bytes_nullable)  # CustomMetadata, not kept
    state = _segment_state(rd.int8())
    tags = rd.tagged_fields(_SEGMENT_TAGS[version])
    return RemoteLogSegmentMetadata(
        segment_id=segment_id,
        start_offset=start_offset,
        end_offset=end_offset,
        max_timestamp_ms=max_timestamp_ms,
        leader_epoch=int(tags.get(1, broker_id)),
        event_timestamp_ms=event_timestamp_ms,
        # Kafka keeps them in a map; the order on the wire is not a promise.
        segment_leader_epochs=tuple(sorted(epochs.items())),
        segment_size_in_bytes=size,
        state=state,
        txn_index_empty=bool(tags.get(0, False)),
    )


def _read_update(rd: _Reader, version: int) -> RemoteLogSegmentMetadataUpdate:
    segment_id = _read_segment_id(rd)
    broker_id, event_timestamp_ms = rd.fixed(_BROKER_EVENT)
    rd.read(r.read_compact_string_as_bytes_nullable)  # CustomMetadata, not kept
    state = _segment_state(rd.int8())
    epoch = rd.tagged_fields(_EPOCH_END_TAGS[version]).get(0, -1)
    return RemoteLogSegmentMetadataUpdate(
        segment_id=segment_id,
        event_timestamp_ms=event_timestamp_ms,
        state=state,
        leader_epoch=epoch if epoch != -1 else broker_id,
    )


def _read_partition_delete(rd: _Reader, version: int) -> RemotePartitionDeleteMetadata:
    tp = _read_topic_id_partition(rd)
    broker_id, event_timestamp_ms = rd.fixed(_BROKER_EVENT)
    value = rd.int8()
    try:
        state = RemotePartitionDeleteState(value)
    except ValueError:
        raise MetadataDecodeError(f"unknown remote partition delete state id {value}") from None
    epoch = rd.tagged_fields(_EPOCH_END_TAGS[version]).get(0, broker_id)
    return RemotePartitionDeleteMetadata(tp, state, event_timestamp_ms, epoch)


def _read_truncation(rd: _Reader, version: int) -> RemoteLogTruncation:
    tp = _read_topic_id_partition(rd)
    leader_epoch = rd.int32()
    event_timestamp_ms = rd.int64()
    offset = rd.int64()
    rd.tagged_fields()
    return RemoteLogTruncation(tp, offset, leader_epoch, event_timestamp_ms)


_READERS: dict[int, tuple[tuple[int, ...], Callable[[_Reader, int], RemoteLogMetadata]]] = {
    SEGMENT_METADATA_API_KEY: (_READ_VERSIONS, _read_segment),
    SEGMENT_METADATA_UPDATE_API_KEY: (_READ_VERSIONS, _read_update),
    PARTITION_DELETE_API_KEY: (_READ_VERSIONS, _read_partition_delete),
    TRUNCATION_API_KEY: ((0,), _read_truncation),
}


def deserialize(data: bytes | memoryview) -> RemoteLogMetadata:
    """Decodes one record value; anything malformed raises MetadataDecodeError."""
    rd = _Reader(data)
    try:
        frame_version = rd.uvarint()
        if frame_version != FRAME_VERSION:
            raise MetadataDecodeError(f"unknown frame version {frame_version}")
        api_key = rd.uvarint()
        version = rd.uvarint()
        try:
            versions, read = _READERS[api_key]
        except KeyError:
            raise MetadataDecodeError(f"unknown remote log metadata api key {api_key}") from None
        if version not in versions:
            raise MetadataDecodeError(f"unsupported version {version} of api key {api_key}")
        record = read(rd, version)
    except MetadataDecodeError:
        raise
    # kio raises its own DecodeError (underflow), ValueError (bad boolean, bad varint) or
    # UnicodeDecodeError (a name that is not UTF-8); struct raises struct.error (a short fixed
    # field); our model raises ValueError on bad offsets.
    except (DecodeError, ValueError, OverflowError, struct.error) as exc:
        raise MetadataDecodeError(f"malformed remote log metadata record: {exc}") from exc
    if rd.pos != len(data):
        raise MetadataDecodeError(f"{len(data) - rd.pos} trailing bytes after a record of api key {api_key}")
    return record


# ---------------------------------------------------------------------------- entries


def _uvarint(value: int) -> bytes:
    buf = io.BytesIO()
    w.write_unsigned_varint(buf, uvarint(value))
    return buf.getvalue()


def encode_entry(record_bytes: bytes) -> bytes:
    """One flat-file entry: unsigned varint length, then the record."""
    return _uvarint(len(record_bytes)) + record_bytes


def iter_entries(data: bytes | memoryview, pos: int = 0) -> Iterator[tuple[RemoteLogMetadata, int]]:
    """Yields (record, position after it) for each entry; a short or bad entry raises."""
    view = memoryview(data)
    while pos < len(view):
        try:
            length, size = r.read_unsigned_varint(view, pos)
        except (DecodeError, ValueError) as exc:
            raise MetadataDecodeError(f"bad entry length at position {pos}: {exc}") from exc
        start = pos + size
        end = start + length
        if end > len(view):
            raise MetadataDecodeError(f"entry at position {pos} needs {length} bytes, {len(view) - start} left")
        yield deserialize(view[start:end]), end
        pos = end


def read_uvarint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Returns (value, position after it); errors are MetadataDecodeError."""
    try:
        value, size = r.read_unsigned_varint(data, pos)
        return value, pos + size
    except (DecodeError, ValueError) as exc:
        raise MetadataDecodeError(f"bad unsigned varint at position {pos}: {exc}") from exc


uvarint_bytes = _uvarint
