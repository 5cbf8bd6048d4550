"""Compact snapshots of remote log metadata: partitions' whole states, loaded without
replaying a record (a few array copies per partition, whatever its segment count).

A partition section (little-endian):

    body length, CRC-32C of the body                       uint32 each
    body:
      topic id (16 bytes), partition (int32), topic name length (uint16),
      delete state (int8, -1 none), its event timestamp (int64) and epoch (int32),
      byte length of each array of `PartitionState.arrays()` (uint32 each),
      topic name (UTF-8), then those arrays' items

The file store's snapshot file (`remote_log_metadata.snapshot`) is a header, then one
section per partition:

    magic "RLMSNAP1", log position (int64: the log's bytes before it are reflected),
    start (int64) and CRC (uint32) of the log's last entry before that position, CRC of
    its first entry (uint32), partition count (uint32), CRC-32C of these fields (uint32)

The topic store's flat files hold one section each (`topic_store.py`). Anything that does not
decode raises MetadataDecodeError: the caller falls back to the records.
"""

from __future__ import annotations

import struct
import sys
import uuid
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

import crc32c

from ..files import atomic_write
from ..model import RemotePartitionDeleteMetadata, RemotePartitionDeleteState, TopicIdPartition
from .partition import ARRAY_TYPECODES, PartitionState
from .serde import MetadataDecodeError

SNAPSHOT_MAGIC = b"RLMSNAP1"
_SECTION = struct.Struct("<II")
_PARTITION = struct.Struct("<16siHbqi" + "I" * len(ARRAY_TYPECODES))
_HEADER = struct.Struct("<8sqqIII")
_CRC = struct.Struct("<I")
_NO_DELETE_STATE = -1
_LITTLE_ENDIAN = sys.byteorder == "little"


def _little_endian(a: array) -> array:
    """`a` with its items little-endian (a copy on a big-endian machine); its own inverse."""
    if _LITTLE_ENDIAN or a.itemsize == 1:
        return a
    swapped = array(a.typecode, a)
    swapped.byteswap()
    return swapped


# ---------------------------------------------------------------------------- partitions


def encode_partition(p: PartitionState) -> bytes:
    arrays = [_little_endian(a) for a in p.arrays()]
    name = p.tp.topic.encode()
    d = p.delete_metadata
    head = _PARTITION.pack(
        p.tp.topic_id.bytes, p.tp.partition, len(name),
        _NO_DELETE_STATE if d is None else int(d.state), 0 if d is None else d.event_timestamp_ms,
        0 if d is None else d.epoch, *(len(a) * a.itemsize for a in arrays))
    body = b"".join([head, name, *arrays])
    return _SECTION.pack(len(body), crc32c.crc32c(body)) + body


class TopicIds:
    """One TopicIdPartition's topic id and name objects per topic, shared by its partitions."""

    def __init__(self) -> None:
        self._known: dict[tuple[bytes, bytes], tuple[uuid.UUID, str]] = {}

    def topic_id_partition(self, topic_id: bytes, name: bytes, partition: int) -> TopicIdPartition:
        known = self._known.get((topic_id, name))
        if known is None:
            known = self._known[(topic_id, name)] = (uuid.UUID(bytes=topic_id), name.decode())
        return TopicIdPartition(known[0], known[1], partition)


def partition_of(body: bytes | memoryview, topic_ids: TopicIds | None = None) -> TopicIdPartition:
    """The partition a section's body holds, without decoding the rest."""
    view = memoryview(body)
    if len(view) < _PARTITION.size:
        raise MetadataDecodeError(f"partition snapshot of {len(view)} bytes is shorter than its header")
    topic_id, partition, name_length, *_ = _PARTITION.unpack_from(view)
    try:
        name = bytes(view[_PARTITION.size:_PARTITION.size + name_length])
        return (topic_ids or TopicIds()).topic_id_partition(topic_id, name, partition)
    except UnicodeDecodeError as exc:
        raise MetadataDecodeError(f"partition snapshot names no topic: {exc}") from exc


def decode_partition(body: bytes | memoryview, topic_ids: TopicIds | None = None) -> PartitionState:
    """One section's body (its CRC already checked)."""
    view = memoryview(body)
    tp = partition_of(view, topic_ids)
    _, _, name_length, delete_state, delete_timestamp, delete_epoch, *lengths = _PARTITION.unpack_from(view)
    pos = _PARTITION.size + name_length
    if pos + sum(lengths) != len(view):
        raise MetadataDecodeError(f"partition snapshot of {len(view)} bytes does not hold its {pos + sum(lengths)}")
    try:
        arrays = []
        for typecode, length in zip(ARRAY_TYPECODES, lengths):
            a = array(typecode)
            a.frombytes(view[pos:pos + length])  # ValueError unless whole items
            arrays.append(_little_endian(a))
            pos += length
        p = PartitionState.from_arrays(tp, arrays)
        if delete_state != _NO_DELETE_STATE:
            p.delete_metadata = RemotePartitionDeleteMetadata(
                tp, RemotePartitionDeleteState(delete_state), delete_timestamp, delete_epoch)
    except ValueError as exc:
        raise MetadataDecodeError(f"partition snapshot does not decode: {exc}") from exc
    return p


_Body = TypeVar("_Body", bytes, memoryview)

def _checked_body(head: bytes, body: _Body) -> _Body:
    length, crc = _SECTION.unpack(head)
    if len(body) != length:
        raise MetadataDecodeError(f"snapshot section of {length} bytes has {len(body)}")
    if crc32c.crc32c(body) != crc:
        raise MetadataDecodeError("snapshot section fails its CRC")
    return body


def read_section(f: BinaryIO) -> bytes | None:
    """The next section's body from `f`, None at its end; a short or corrupt one raises."""
    head = f.read(_SECTION.size)
    if not head:
        return None
    if len(head) < _SECTION.size:
        raise MetadataDecodeError("snapshot ends inside a section header")
    return _checked_body(head, f.read(_SECTION.unpack(head)[0]))


def section_body(data: bytes | memoryview) -> bytes | memoryview:
    """The body of the one section that `data` is; a short, long or corrupt one raises."""
    if len(data) < _SECTION.size:
        raise MetadataDecodeError("snapshot section is shorter than its header")
    return _checked_body(bytes(data[:_SECTION.size]), memoryview(data)[_SECTION.size:])


# ---------------------------------------------------------------------------- the file store's snapshot


@dataclass(frozen=True, slots=True)
class LogPosition:
    """Where a snapshot stands in the metadata log: `position` bytes, whose last entry starts
    at `last_entry` with CRC `last_crc` and whose first entry has CRC `first_crc` (so a
    snapshot does not match another log, or this one cut shorter)."""

    position: int = 0
    last_entry: int = 0
    last_crc: int = 0
    first_crc: int = 0

    def after(self, entry_start: int, entry_end: int, crc: int) -> LogPosition:
        """The position after one more entry, which starts where this position is or later."""
        return LogPosition(entry_end, entry_start, crc, self.first_crc if self.position else crc)


def write_snapshot(path: Path, at: LogPosition, partitions: Iterable[PartitionState]) -> None:
    partitions = list(partitions)
    with atomic_write(path) as out:
        header = _HEADER.pack(SNAPSHOT_MAGIC, at.position, at.last_entry, at.last_crc, at.first_crc, len(partitions))
        out.write(header + _CRC.pack(crc32c.crc32c(header)))
        for p in partitions:
            out.write(encode_partition(p))


def read_snapshot_header(f: BinaryIO) -> tuple[LogPosition, int]:
    """(log position, partition count) from the start of a snapshot file."""
    data = f.read(_HEADER.size + _CRC.size)
    if len(data) < _HEADER.size + _CRC.size:
        raise MetadataDecodeError("snapshot file is shorter than its header")
    magic, position, last_entry, last_crc, first_crc, count = _HEADER.unpack_from(data)
    if magic != SNAPSHOT_MAGIC:
        raise MetadataDecodeError(f"not a remote log metadata snapshot (magic {magic!r})")
    if _CRC.unpack_from(data, _HEADER.size)[0] != crc32c.crc32c(data[:_HEADER.size]):
        raise MetadataDecodeError("snapshot header fails its CRC")
    return LogPosition(position, last_entry, last_crc, first_crc), count


def read_snapshot_partitions(
    f: BinaryIO, count: int, keep: Callable[[TopicIdPartition], bool] | None = None
) -> Iterator[PartitionState]:
    """The `count` partitions after the header (those `keep` says, if given), one section in
    memory at a time."""
    topic_ids = TopicIds()
    for _ in range(count):
        body = read_section(f)
        if body is None:
            raise MetadataDecodeError(f"snapshot ends before its {count} partitions")
        if keep is None or keep(partition_of(body, topic_ids)):
            yield decode_partition(body, topic_ids)
    if f.read(1):
        raise MetadataDecodeError("bytes after the last partition of the snapshot")
