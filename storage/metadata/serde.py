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
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeAlias

from kio.serial import readers as r
from kio.serial import writers as w
from kio.serial.errors import DecodeError

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
_ZERO_UUID = uuid.UUID(int=0)


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
    w.write_int32(buf, tp.partition)
    w.write_empty_tagged_fields(buf)


def _write_segment_id(buf: io.BytesIO, segment_id: RemoteLogSegmentId) -> None:
    _write_topic_id_partition(buf, segment_id.topic_id_partition)
    w.write_uuid(buf, segment_id.id)
    w.write_empty_tagged_fields(buf)


def _write_segment(buf: io.BytesIO, m: RemoteLogSegmentMetadata) -> None:
    _write_segment_id(buf, m.segment_id)
    w.write_int64(buf, m.start_offset)
    w.write_int64(buf, m.end_offset)
    w.write_int32(buf, m.leader_epoch)  # BrokerId
    w.write_int64(buf, m.max_timestamp_ms)
    w.write_int64(buf, m.event_timestamp_ms)
    w.write_compact_array_length(buf, len(m.segment_leader_epochs))
    for epoch, offset in m.segment_leader_epochs:
        w.write_int32(buf, epoch)
        w.write_int64(buf, offset)
        w.write_empty_tagged_fields(buf)
    w.write_int32(buf, m.segment_size_in_bytes)
    w.write_nullable_compact_string(buf, None)  # CustomMetadata: null
    w.write_int8(buf, int(m.state))
    # Tagged field 0 (TxnIndexEmpty, default false) is written only when set, as Kafka does.
    if m.txn_index_empty:
        w.write_unsigned_varint(buf, 1)
        w.write_unsigned_varint(buf, 0)
        w.write_unsigned_varint(buf, 1)
        w.write_boolean(buf, True)
    else:
        w.write_empty_tagged_fields(buf)


def _write_update(buf: io.BytesIO, u: RemoteLogSegmentMetadataUpdate) -> None:
    _write_segment_id(buf, u.segment_id)
    w.write_int32(buf, u.leader_epoch)  # BrokerId
    w.write_int64(buf, u.event_timestamp_ms)
    w.write_nullable_compact_string(buf, None)  # CustomMetadata: null
    w.write_int8(buf, int(u.state))
    w.write_empty_tagged_fields(buf)


def _write_partition_delete(buf: io.BytesIO, d: RemotePartitionDeleteMetadata) -> None:
    _write_topic_id_partition(buf, d.topic_id_partition)
    w.write_int32(buf, d.epoch)  # BrokerId
    w.write_int64(buf, d.event_timestamp_ms)
    w.write_int8(buf, int(d.state))
    w.write_empty_tagged_fields(buf)


def _write_truncation(buf: io.BytesIO, t: RemoteLogTruncation) -> None:
    _write_topic_id_partition(buf, t.topic_id_partition)
    w.write_int32(buf, t.leader_epoch)
    w.write_int64(buf, t.event_timestamp_ms)
    w.write_int64(buf, t.truncation_offset)
    w.write_empty_tagged_fields(buf)


_WRITERS: dict[type, tuple[int, Callable[[io.BytesIO, object], None]]] = {
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
    w.write_unsigned_varint(buf, FRAME_VERSION)
    w.write_unsigned_varint(buf, api_key)
    w.write_unsigned_varint(buf, WRITE_VERSION)
    write(buf, record)
    return buf.getvalue()


# ---------------------------------------------------------------------------- reading


class _Reader:
    """A cursor over one record; kio's native readers return (value, bytes consumed)."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        self.pos = 0

    def read(self, reader):  # type: ignore[no-untyped-def]
        value, size = reader(self.data, self.pos)
        self.pos += size
        return value

    def uvarint(self) -> int:
        return self.read(r.read_unsigned_varint)

    def int8(self) -> int:
        return self.read(r.read_int8)

    def int32(self) -> int:
        return self.read(r.read_int32)

    def int64(self) -> int:
        return self.read(r.read_int64)

    def uuid(self) -> uuid.UUID:
        # kio reads Kafka's zero uuid as None.
        return self.read(r.read_uuid) or _ZERO_UUID

    def skip(self, size: int) -> None:
        if self.pos + size > len(self.data):
            raise MetadataDecodeError("tagged field runs past the end of the record")
        self.pos += size

    def tagged_fields(self, known: dict[int, Callable[[_Reader], None]]) -> None:
        """Reads a tagged-field section; a known tag is decoded, an unknown one skipped."""
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            size = self.uvarint()
            end = self.pos + size
            if tag in known:
                known[tag](self)
                if self.pos != end:
                    raise MetadataDecodeError(f"tagged field {tag} has size {size} but decoded {self.pos - end + size}")
            else:
                self.skip(size)


def _read_topic_id_partition(rd: _Reader) -> TopicIdPartition:
    name = rd.read(r.read_compact_string)
    topic_id = rd.uuid()
    partition = rd.int32()
    rd.tagged_fields({})
    return TopicIdPartition(topic_id, name, partition)


def _read_segment_id(rd: _Reader) -> RemoteLogSegmentId:
    tp = _read_topic_id_partition(rd)
    segment_uuid = rd.uuid()
    rd.tagged_fields({})
    return RemoteLogSegmentId(tp, segment_uuid)


def _segment_state(value: int) -> RemoteLogSegmentState:
    try:
        return RemoteLogSegmentState(value)
    except ValueError:
        raise MetadataDecodeError(f"unknown remote log segment state id {value}") from None


def _read_segment(rd: _Reader, version: int) -> RemoteLogSegmentMetadata:
    segment_id = _read_segment_id(rd)
    start_offset = rd.int64()
    end_offset = rd.int64()
    broker_id = rd.int32()
    max_timestamp_ms = rd.int64()
    event_timestamp_ms = rd.int64()
    count = rd.read(r.read_compact_array_length)
    if count is None:
        raise MetadataDecodeError("null SegmentLeaderEpochs")
    epochs: dict[int, int] = {}
    for _ in range(count):
        epoch = rd.int32()
        epochs[epoch] = rd.int64()
        rd.tagged_fields({})
    if len(epochs) != count:
        raise MetadataDecodeError("duplicate leader epoch in SegmentLeaderEpochs")
    size = rd.int32()
    rd.read(r.read_compact_string_as_bytes_nullable)  # CustomMetadata, not kept
    state = _segment_state(rd.int8())
    tags: dict[str, object] = {}

    def txn_index_empty(x: _Reader) -> None:
        tags["txn"] = x.read(r.read_boolean)

    def broker_leader_epoch(x: _Reader) -> None:
        tags["epoch"] = x.int32()

    known = {0: txn_index_empty}
    if version >= 1:
        known[1] = broker_leader_epoch
    rd.tagged_fields(known)
    return RemoteLogSegmentMetadata(
        segment_id=segment_id,
        start_offset=start_offset,
        end_offset=end_offset,
        max_timestamp_ms=max_timestamp_ms,
        leader_epoch=int(tags.get("epoch", broker_id)),  # type: ignore[call-overload]
        event_timestamp_ms=event_timestamp_ms,
        # Kafka keeps them in a map; the order on the wire is not a promise.
        segment_leader_epochs=tuple(sorted(epochs.items())),
        segment_size_in_bytes=size,
        state=state,
        txn_index_empty=bool(tags.get("txn", False)),
    )


def _read_update(rd: _Reader, version: int) -> RemoteLogSegmentMetadataUpdate:
    segment_id = _read_segment_id(rd)
    broker_id = rd.int32()
    event_timestamp_ms = rd.int64()
    rd.read(r.read_compact_string_as_bytes_nullable)  # CustomMetadata, not kept
    state = _segment_state(rd.int8())
    tags: dict[str, int] = {}
    known: dict[int, Callable[[_Reader], None]] = {}
    if version >= 1:
        known[0] = lambda x: tags.__setitem__("epoch", x.int32())
        known[1] = lambda x: tags.__setitem__("end", x.int64())  # EndOffset, not kept
    rd.tagged_fields(known)
    epoch = tags.get("epoch", -1)
    return RemoteLogSegmentMetadataUpdate(
        segment_id=segment_id,
        event_timestamp_ms=event_timestamp_ms,
        state=state,
        leader_epoch=epoch if epoch != -1 else broker_id,
    )


def _read_partition_delete(rd: _Reader, version: int) -> RemotePartitionDeleteMetadata:
    tp = _read_topic_id_partition(rd)
    broker_id = rd.int32()
    event_timestamp_ms = rd.int64()
    value = rd.int8()
    try:
        state = RemotePartitionDeleteState(value)
    except ValueError:
        raise MetadataDecodeError(f"unknown remote partition delete state id {value}") from None
    tags: dict[str, int] = {}
    known: dict[int, Callable[[_Reader], None]] = {}
    if version >= 1:
        known[0] = lambda x: tags.__setitem__("epoch", x.int32())
        known[1] = lambda x: tags.__setitem__("end", x.int64())
    rd.tagged_fields(known)
    return RemotePartitionDeleteMetadata(tp, state, event_timestamp_ms, tags.get("epoch", broker_id))


def _read_truncation(rd: _Reader, version: int) -> RemoteLogTruncation:
    tp = _read_topic_id_partition(rd)
    leader_epoch = rd.int32()
    event_timestamp_ms = rd.int64()
    offset = rd.int64()
    rd.tagged_fields({})
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
    # UnicodeDecodeError (a name that is not UTF-8); our model raises ValueError on bad offsets.
    except (DecodeError, ValueError, OverflowError) as exc:
        raise MetadataDecodeError(f"malformed remote log metadata record: {exc}") from exc
    if rd.pos != len(data):
        raise MetadataDecodeError(f"{len(data) - rd.pos} trailing bytes after a record of api key {api_key}")
    return record


# ---------------------------------------------------------------------------- entries


def _uvarint(value: int) -> bytes:
    buf = io.BytesIO()
    w.write_unsigned_varint(buf, value)
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
