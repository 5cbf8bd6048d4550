"""RemoteStorageManager: the remote tier's segment store (Kafka's KIP-405 interface, async).

One segment is a handful of objects next to each other, named by `segment_object_key`:

    <prefix>/<topic>-<topicId>/<partition>/<20-digit start offset>-<segment id>.<ext>

with ext one of `log`, `index`, `timeindex`, `txnindex`, `snapshot`,
`leader_epoch_checkpoint` and `manifest`. Topic and segment ids are written as
Kafka prints a Uuid (22 characters of unpadded URL-safe base64), like Aiven's
tiered-storage plugin; its suffixes differ (`leader-epoch-checkpoint`, `rsm-manifest`).

A copy writes the manifest (see `storage.manifest`) last; a delete removes it
first. So a segment with a manifest is complete, and one without is never served.

With an active encryption key (`storage.encryption`) a copy stores every object
encrypted under a data key of its own and records the wrapped data key in the manifest;
reads decrypt here, so callers see the same plaintext either way, and segments copied
before encryption was turned on read as they always did.

Behaviour the Java interface leaves open, fixed here:
- `fetch_log_segment` positions are inclusive, as in Kafka. An end past the last
  byte is clamped to it; a start at or past the end gives an empty stream (what
  Kafka's reference store does when it skips past the end of the file). A negative
  start or an end before the start is a ValueError, as Kafka's IllegalArgumentException.
- `fetch_index(TRANSACTION)` of a segment copied without a transaction index raises
  RemoteResourceNotFound, as Kafka's does; Kafka's index cache then uses an empty index.
- Deleting what is gone succeeds.
"""

from __future__ import annotations

import abc
import contextlib
import asyncio
import base64
import enum
import itertools
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import crc32c
from cachetools import LRUCache

from .encryption import KeyRing, ObjectCipher, SegmentCipher
from .errors import (
    CorruptRangeRead,
    CorruptRemoteSegment,
    RemoteObjectMismatch,
    RemoteResourceNotFound,
    RemoteSegmentNotFound,
    RemoteStorageError,
)
from .manifest import TAG_BYTES, Crc32cAccumulator, Manifest, ObjectEntry, entry_of
from .model import IndexType, LogSegmentData, RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition


log = logging.getLogger(__name__)

# Reused buffers for encrypted reads kept at most: as many as chunk loads usually run at
# once (a few partitions, each with its read-ahead), about 4 MiB each.
_SEALED_BUFFERS_KEPT = 16
# Pieces in which a local file is read to be stored unencrypted: few writes, bounded memory.
PUT_PIECE_BYTES = 4 << 20


class ObjectType(enum.Enum):
    """The objects of one remote segment; the value is the key's extension."""

    LOG = "log"
    OFFSET_INDEX = "index"
    TIME_INDEX = "timeindex"
    TRANSACTION_INDEX = "txnindex"
    PRODUCER_SNAPSHOT = "snapshot"
    LEADER_EPOCH_CHECKPOINT = "leader_epoch_checkpoint"
    MANIFEST = "manifest"

    @classmethod
    def of_index(cls, index_type: IndexType) -> ObjectType:
        # IndexType carries Kafka's file suffixes (".index", ...); ours drop the dot.
        return cls(index_type.suffix.removeprefix("."))

    @classmethod
    def of_key(cls, key: str) -> ObjectType:
        """The type of the object `segment_object_key` named."""
        return cls(key.rpartition(".")[2])


def kafka_uuid(value: uuid.UUID) -> str:
    """A Uuid as Kafka prints it (`Uuid.toString`): URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode("ascii")


def partition_key_prefix(prefix: str, topic_id_partition: TopicIdPartition) -> str:
    """Every object of a partition has a key starting with this (it ends with '/')."""
    tip = topic_id_partition
    head = prefix.strip("/")
    head = f"{head}/" if head else ""
    return f"{head}{tip.topic}-{kafka_uuid(tip.topic_id)}/{tip.partition}/"


def _segment_name(metadata: RemoteLogSegmentMetadata) -> str:
    """How errors name a segment."""
    return f"segment {metadata.segment_id.id} of {metadata.topic_id_partition}"


def segment_key_prefix(prefix: str, metadata: RemoteLogSegmentMetadata) -> str:
    """Every object of a segment has a key starting with this (it ends with '.')."""
    partition = partition_key_prefix(prefix, metadata.topic_id_partition)
    return f"{partition}{metadata.start_offset:020d}-{kafka_uuid(metadata.segment_id.id)}."


def segment_object_key(prefix: str, metadata: RemoteLogSegmentMetadata, object_type: ObjectType) -> str:
    return segment_key_prefix(prefix, metadata) + object_type.value


class RemoteStorageManager(abc.ABC):
    """Copy, fetch and delete remote log segments. Every method is idempotent or read-only.

    Errors: RemoteResourceNotFound for a missing segment or object (RemoteSegmentNotFound
    when the manifest is, also beside objects of an unfinished copy), CorruptRemoteSegment
    when an object disagrees with its manifest, otherwise
    RemoteStorageError telling whether a retry may succeed. Nothing from the
    underlying store escapes raw.
    """

    #: Whether `read_log_run` reads a run of buffers with one request: a store whose every
    #: request costs more than a few MiB of its bytes (HTTP). Otherwise a reader gains
    #: nothing from runs and reads chunks each on its own, side by side.
    reads_runs = False

    @abc.abstractmethod
    async def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, segment_data: LogSegmentData) -> None:
        """Upload the segment's files, then its manifest. A retried copy overwrites."""

    @abc.abstractmethod
    def fetch_log_segment(
        self, metadata: RemoteLogSegmentMetadata, start_position: int, end_position: int | None = None
    ) -> AsyncGenerator[bytes | memoryview, None]:
        """Stream `.log` bytes [start_position, end_position], both inclusive, in chunks.

        Errors surface on the first iteration. A caller that stops early should
        close the stream (`contextlib.aclosing`) to release the connection at once.
        """

    async def read_log_into(self, metadata: RemoteLogSegmentMetadata, start_position: int, buffer: memoryview) -> None:
        """Fill `buffer` with the `.log` bytes from `start_position` on, checked as
        `fetch_log_segment` checks them; CorruptRemoteSegment when the segment has fewer.

        A reader that keeps a buffer per chunk (the chunk cache) passes one it reuses, so
        that a load does not fault in fresh memory; a store that can read straight into it
        does (the local one), the others' chunks are copied into it once.
        """
        stream = self.fetch_log_segment(metadata, start_position, start_position + len(buffer) - 1)
        await _fill(buffer, stream, metadata, start_position)

    async def read_log_run(self, metadata: RemoteLogSegmentMetadata, start_position: int,
                           buffers: Sequence[memoryview]) -> AsyncGenerator[memoryview, None]:
        """Fill `buffers` with consecutive `.log` bytes from `start_position` on, each as
        `read_log_into` fills one, yielding each buffer as soon as it is filled and checked.

        An error is about the buffer being filled (CorruptRangeRead telling how much of it
        is checked); the buffers yielded before it are good. A store whose every read is a
        request (an object store) reads the run with one; this default reads each alone.
        """
        for buffer in buffers:
            await self.read_log_into(metadata, start_position, buffer)
            yield buffer
            start_position += len(buffer)

    @abc.abstractmethod
    async def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        """The whole index, checked against the manifest's size and CRC-32C."""

    async def checks_log_blocks(self, metadata: RemoteLogSegmentMetadata) -> bool:
        """Whether `fetch_log_segment` checks every block of the segment's `.log` against a
        CRC-32C before passing it on. A store that does not leaves the check to its reader."""
        return False

    @abc.abstractmethod
    async def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Remove the segment's objects, manifest first. Deleting what is gone succeeds."""

    @abc.abstractmethod
    async def verify_segment(self, metadata: RemoteLogSegmentMetadata, *, check_crc: bool = False) -> Manifest:
        """Check that every object the manifest lists is stored with its size (and, on
        request, its CRC-32C) there: RemoteObjectMismatch names the first that is not.

        The CRC-32C is the one the store recorded when the object was written, where it
        keeps one (S3's own checksum, read with a HEAD); otherwise the object is read back.
        """

    async def fetch_manifest(self, metadata: RemoteLogSegmentMetadata) -> Manifest:
        """The segment's manifest: its objects and sizes, and the id of its encryption key."""
        return await self.verify_segment(metadata)

    @abc.abstractmethod
    async def list_partition_objects(self, topic_id_partition: TopicIdPartition) -> list[str]:
        """Keys of every object stored for the partition, sorted."""

    @abc.abstractmethod
    async def delete_partition(self, topic_id_partition: TopicIdPartition) -> None:
        """Remove every object of the partition (partition removal); idempotent."""

    async def start(self) -> None:
        """Work a first read would do otherwise (a client made, its models loaded), done
        before serving; it reaches no store, so a store that is down does not stop a start."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    # Whole objects beside the segments, named below the store's key prefix (the remote log
    # metadata that storage/metadata/bucket.py publishes and reads). A store of segments only
    # keeps none.

    async def put_object(self, name: str, data: bytes) -> None:
        """Stores `data` as the object `name`, replacing it whole."""
        raise self._no_objects()

    async def get_object(self, name: str) -> bytes:
        """The object `name`; RemoteResourceNotFound when there is none."""
        raise self._no_objects()

    async def list_objects(self, name_prefix: str) -> list[str]:
        """Names of the objects starting with `name_prefix`, sorted."""
        raise self._no_objects()

    async def delete_objects(self, names: Iterable[str]) -> None:
        """Removes the objects; missing ones are not an error."""
        raise self._no_objects()

    def object_location(self, name: str) -> str:
        """Where the object `name` is, for messages: with the bucket (or directory) and key prefix."""
        return name

    def _no_objects(self) -> RemoteStorageError:
        return RemoteStorageError(f"{type(self).__name__} keeps no objects but segments", retriable=False)

    def observe_requests(self, observer: Callable[[str, float, bool], None]) -> None:
        """Report each request this manager sends to its store to `observer`, as
        (operation, seconds, succeeded). A manager without requests of its own to
        report ignores it."""

    def observe_range_reads(self, observer: Callable[[float, float, int], None]) -> None:
        """Report each `read_log_into` that succeeds to `observer`, as (seconds until the
        store's first byte, seconds for the bytes after it, bytes read): what a reader sizes
        its read-ahead by. A manager that cannot tell the two apart ignores it."""

    async def __aenter__(self) -> RemoteStorageManager:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class ObjectStoreRemoteStorageManager(RemoteStorageManager):
    """The segment logic once, over a small object-store interface each backend implements.

    Backends implement the `_`-prefixed primitives, map their own failures to
    storage errors, and raise RemoteResourceNotFound for a missing key.
    """

    def __init__(self, *, prefix: str = "", manifest_cache_size: int = 1024, keys: KeyRing | None = None) -> None:
        self.prefix = prefix
        # Encryption keys: new segments are encrypted with the active one, if any.
        self.keys = keys if keys is not None else KeyRing()
        # (operation, seconds, succeeded) of every request to the store: the proxy's
        # latency histogram listens here; storage/ itself keeps no metrics.
        self.observe_request: Callable[[str, float, bool], None] = lambda operation, seconds, ok: None
        # Fetches of one segment come in runs (sequential reads of a partition):
        # caching its manifest saves a round trip to the store per fetch.
        self._manifests: LRUCache[RemoteLogSegmentId, Manifest] = LRUCache(maxsize=manifest_cache_size)
        # Where encrypted chunks are read before they are decrypted into the caller's
        # buffer: reused, so that a read does not fault in fresh memory.
        self._sealed_buffers: list[bytearray] = []
        self._observe_range_read: Callable[[float, float, int], None] = lambda first_byte, rest, size: None
        self._said_why_no_runs = False  # the warning that chunks cannot be read in runs, once

    def observe_requests(self, observer: Callable[[str, float, bool], None]) -> None:
        self.observe_request = observer

    def observe_range_reads(self, observer: Callable[[float, float, int], None]) -> None:
        self._observe_range_read = observer

    # -- primitives -------------------------------------------------------------

    @abc.abstractmethod
    async def _put_stream(self, key: str, chunks: Iterator[bytes], size: int) -> ObjectEntry:
        """Store the `size` bytes `chunks` yields; returns size and CRC-32C of what was stored.

        `chunks` reads a local file (and encrypts): iterate it in a worker thread.
        """

    @abc.abstractmethod
    async def _put_bytes(self, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    async def _get_bytes(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def _open_range(
        self, key: str, first: int, last: int, into: Sequence[memoryview] = ()
    ) -> AbstractAsyncContextManager[tuple[int, AsyncGenerator[bytes | memoryview, None]]]:
        """Open bytes [first, last] of an object (inclusive, last < its size).

        Yields the object's total size and an iterator over the range's chunks;
        leaving the context releases the file or connection. A backend that can read
        straight into `into` (buffers as long as the range together, filled in turn)
        yields views of them, in order, none across two; one that cannot ignores it.
        """

    @abc.abstractmethod
    async def _object_size(self, key: str) -> int | None:
        """Size of an object, None when it does not exist."""

    async def _stored_checksum(self, key: str) -> tuple[int, int | None] | None:
        """Size of an object and the CRC-32C the store recorded for it when it was written,
        None for the CRC-32C when it recorded none; None when the object does not exist.
        A store that keeps no checksums of its own reports the size alone."""
        size = await self._object_size(key)
        return None if size is None else (size, None)

    @abc.abstractmethod
    async def _delete(self, keys: Iterable[str]) -> None:
        """Remove objects; missing ones are not an error."""

    @abc.abstractmethod
    async def _list(self, key_prefix: str) -> list[str]:
        """Keys starting with `key_prefix`."""

    # -- RemoteStorageManager ---------------------------------------------------

    def _key(self, metadata: RemoteLogSegmentMetadata, object_type: ObjectType) -> str:
        return segment_object_key(self.prefix, metadata, object_type)

    async def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, segment_data: LogSegmentData) -> None:
        # A retried copy is incomplete until its own manifest lands, and a transaction
        # index left by an earlier attempt must not outlive it.
        stale = [self._key(metadata, ObjectType.MANIFEST)]
        if segment_data.transaction_index is None:
            stale.append(self._key(metadata, ObjectType.TRANSACTION_INDEX))
        self._forget(metadata)
        await self._delete(stale)

        cipher = self.keys.seal_segment(metadata.segment_id.id)  # a new data key for every copy
        files = {
            ObjectType.LOG: segment_data.log_segment,
            ObjectType.OFFSET_INDEX: segment_data.offset_index,
            ObjectType.TIME_INDEX: segment_data.time_index,
            ObjectType.TRANSACTION_INDEX: segment_data.transaction_index,
            ObjectType.PRODUCER_SNAPSHOT: segment_data.producer_snapshot_index,
        }
        entries: dict[str, ObjectEntry] = {}

        async def put_file(object_type: ObjectType, path: Path) -> None:
            entries[object_type.value] = await self._put_file(self._key(metadata, object_type), path, cipher)

        async def put_leader_epochs(data: bytes) -> None:
            extension = ObjectType.LEADER_EPOCH_CHECKPOINT.value
            stored = data if cipher is None else cipher.object(extension, len(data)).seal_all(data)
            await self._put_bytes(self._key(metadata, ObjectType.LEADER_EPOCH_CHECKPOINT), stored)
            entries[extension] = entry_of(data) if cipher is None else ObjectEntry(len(data), crc32c.crc32c(stored))

        try:
            async with asyncio.TaskGroup() as group:
                for object_type, path in files.items():
                    if path is not None:
                        group.create_task(put_file(object_type, path))
                group.create_task(put_leader_epochs(segment_data.leader_epoch_index))
        except BaseExceptionGroup as group_error:
            # Callers expect one storage error, not a group: raise the first failure.
            raise group_error.exceptions[0] from group_error

        manifest = Manifest(metadata.segment_id.id, metadata.start_offset, metadata.end_offset, entries,
                            None if cipher is None else cipher.encryption)
        await self._put_bytes(self._key(metadata, ObjectType.MANIFEST), manifest.encode())
        self._manifests[metadata.segment_id] = manifest

    def fetch_log_segment(
        self, metadata: RemoteLogSegmentMetadata, start_position: int, end_position: int | None = None
    ) -> AsyncGenerator[bytes | memoryview, None]:
        if start_position < 0:
            raise ValueError(f"start position {start_position} is negative")
        if end_position is not None and end_position < start_position:
            raise ValueError(f"end position {end_position} is before start position {start_position}")
        return self._stream_log(metadata, start_position, end_position)

    async def read_log_into(self, metadata: RemoteLogSegmentMetadata, start_position: int, buffer: memoryview) -> None:
        stream = self._stream_log(metadata, start_position, start_position + len(buffer) - 1, into=buffer)
        await _fill(buffer, stream, metadata, start_position)

    async def _stream_log(
        self, metadata: RemoteLogSegmentMetadata, start: int, end: int | None, *, into: memoryview | None = None
    ) -> AsyncGenerator[bytes | memoryview, None]:
        manifest = await self._manifest(metadata)
        entry = _entry(manifest, metadata, ObjectType.LOG)
        size = entry.size
        if start >= size:
            return
        last = size - 1 if end is None else min(end, size - 1)
        key = self._key(metadata, ObjectType.LOG)
        delivered = 0
        scratch: bytearray | None = None
        try:
            sealed = self._object_cipher(manifest, metadata, ObjectType.LOG)
            first, stop = _stored_span(entry, sealed, start, last)
            stored_size = manifest.stored_size(entry)
            # Straight into the caller's buffer when the stored bytes are the range itself;
            # encrypted, into a reused one, each chunk then decrypted into the caller's.
            if sealed is not None and into is not None:
                scratch = self._sealed_buffer(stop - first)
                target: memoryview | None = memoryview(scratch)[:stop - first]
            else:
                target = into if sealed is None and first == start and stop == last + 1 else None
            started = time.monotonic()
            into_target = [target] if target is not None else []
            async with self._open_range(key, first, stop - 1, into_target) as (object_size, chunks):
                opened = time.monotonic()  # the response's head: its first byte
                if object_size != stored_size:
                    raise CorruptRemoteSegment(f"{key}: size {object_size}, manifest says {stored_size}")
                async for chunk in _checked(chunks, key, entry, sealed, first, start, last, target, into):
                    delivered += len(chunk)
                    yield chunk
            if delivered != last - start + 1:
                raise CorruptRemoteSegment(f"{key}: got {delivered} bytes of range [{start}, {last}]")
            if into is not None:
                self._observe_range_read(opened - started, time.monotonic() - opened, stop - first)
        except (RemoteResourceNotFound, CorruptRemoteSegment):
            self._forget(metadata)  # the next call looks at the store again
            raise
        finally:
            if scratch is not None and len(self._sealed_buffers) < _SEALED_BUFFERS_KEPT:
                self._sealed_buffers.append(scratch)

    async def read_log_run(self, metadata: RemoteLogSegmentMetadata, start_position: int,
                           buffers: Sequence[memoryview]) -> AsyncGenerator[memoryview, None]:
        manifest = await self._manifest(metadata)
        entry = _entry(manifest, metadata, ObjectType.LOG)
        sealed = self._object_cipher(manifest, metadata, ObjectType.LOG)
        starts = list(itertools.accumulate((len(b) for b in buffers[:-1]), initial=start_position))
        spans = [_stored_span(entry, sealed, start, start + len(b) - 1) for start, b in zip(starts, buffers)]
        # One request when the buffers' stored spans follow each other and each is its
        # buffer's range or (encrypted) whole sealed chunks; else one read per buffer.
        misaligned = any(a[1] != b[0] for a, b in zip(spans, spans[1:])) \
            or (sealed is None and any(first != start or stop - first != len(b)
                                       for (first, stop), start, b in zip(spans, starts, buffers)))
        if not self.reads_runs or len(buffers) < 2 or starts[-1] + len(buffers[-1]) > entry.size or misaligned:
            if self.reads_runs and len(buffers) >= 2 and misaligned and not self._said_why_no_runs:
                self._said_why_no_runs = True
                unit = sealed.chunk_bytes if sealed is not None else entry.block_bytes
                log.warning("chunks of %d bytes are not whole %s of %d bytes: each chunk is read with a "
                            "request of its own, not in runs; a remote.log.chunk.size.bytes that is a multiple "
                            "of %d reads runs", len(buffers[0]),
                            "encrypted pieces" if sealed is not None else "checksum blocks", unit, unit)
            async for buffer in super().read_log_run(metadata, start_position, buffers):
                yield buffer
            return
        key = self._key(metadata, ObjectType.LOG)
        stored_size = manifest.stored_size(entry)
        first, stop = spans[0][0], spans[-1][1]
        scratch = self._sealed_buffer(stop - first) if sealed is not None else None
        targets = ([memoryview(scratch)[a - first:b - first] for a, b in spans] if scratch is not None
                   else list(buffers))
        try:
            started = time.monotonic()
            async with self._open_range(key, first, stop - 1, targets) as (object_size, chunks), \
                    contextlib.aclosing(chunks):
                opened = time.monotonic()  # the response's head: its first byte
                if object_size != stored_size:
                    raise CorruptRemoteSegment(f"{key}: size {object_size}, manifest says {stored_size}")
                pieces = _Pieces(chunks)
                for buffer, target, start, (span_first, span_stop) in zip(buffers, targets, starts, spans):
                    last = start + len(buffer) - 1
                    stream = _checked(pieces.take(span_stop - span_first), key, entry, sealed, span_first,
                                      start, last, target, buffer)
                    await _fill(buffer, stream, metadata, start)
                    yield buffer
            self._observe_range_read(opened - started, time.monotonic() - opened, stop - first)
        except (RemoteResourceNotFound, CorruptRemoteSegment):
            self._forget(metadata)
            raise
        finally:
            if scratch is not None and len(self._sealed_buffers) < _SEALED_BUFFERS_KEPT:
                self._sealed_buffers.append(scratch)

    def _sealed_buffer(self, size: int) -> bytearray:
        while self._sealed_buffers:
            buffer = self._sealed_buffers.pop()
            if len(buffer) >= size:
                return buffer
        return bytearray(size)

    async def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        object_type = ObjectType.of_index(index_type)
        key = self._key(metadata, object_type)
        # A cold segment's index is asked for beside its manifest, not a round trip after it;
        # the manifest then decides whether its bytes are the index (checked as ever).
        early: asyncio.Task[bytes] | None = None
        if metadata.segment_id not in self._manifests and not (
                index_type is IndexType.TRANSACTION and metadata.txn_index_empty):
            early = asyncio.ensure_future(self._get_bytes(key))
        try:
            return await self._checked_index(metadata, index_type, key, early)
        finally:
            if early is not None:
                early.cancel()  # not needed after all (or the read failed before it)
                early.add_done_callback(_retrieved)

    async def _checked_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType, key: str,
                             early: asyncio.Task[bytes] | None) -> bytes:
        object_type = ObjectType.of_index(index_type)
        manifest = await self._manifest(metadata)
        entry = manifest.entry(object_type.value)
        if entry is None:
            raise RemoteResourceNotFound(
                f"segment {metadata.segment_id.id} was copied without a {index_type.name} index"
            )
        try:
            sealed = self._object_cipher(manifest, metadata, object_type)
            data = await (early if early is not None else self._get_bytes(key))
            if sealed is not None:
                if len(data) != sealed.stored_size:
                    raise CorruptRemoteSegment(f"{key}: size {len(data)}, manifest says {sealed.stored_size}")
                return sealed.open_all(data, key)
            actual = entry_of(data)
            if actual != entry:
                raise CorruptRemoteSegment(_mismatch(key, actual.size, actual.crc32c, entry.size, entry.crc32c))
        except (RemoteResourceNotFound, CorruptRemoteSegment):
            self._forget(metadata)
            raise
        return data

    async def checks_log_blocks(self, metadata: RemoteLogSegmentMetadata) -> bool:
        # An encrypted segment's chunks pass their GCM tags before use; manifests written
        # before block checksums give plaintext ranged reads the size check only.
        manifest = await self._manifest(metadata)
        return manifest.encryption is not None or bool(_entry(manifest, metadata, ObjectType.LOG).blocks)

    async def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        self._forget(metadata)
        await self._delete([self._key(metadata, ObjectType.MANIFEST)])
        await self._delete([self._key(metadata, t) for t in ObjectType if t is not ObjectType.MANIFEST])

    async def verify_segment(self, metadata: RemoteLogSegmentMetadata, *, check_crc: bool = False) -> Manifest:
        self._forget(metadata)  # verify what is stored now, not what was cached
        manifest = await self._manifest(metadata)
        try:
            _entry(manifest, metadata, ObjectType.LOG)
            for extension, entry in manifest.objects.items():
                key = segment_key_prefix(self.prefix, metadata) + extension
                await self._verify_object(key, manifest.stored_size(entry), entry.crc32c, check_crc)
        except CorruptRemoteSegment:
            self._forget(metadata)
            raise
        return manifest

    async def fetch_manifest(self, metadata: RemoteLogSegmentMetadata) -> Manifest:
        return await self._manifest(metadata)

    async def list_partition_objects(self, topic_id_partition: TopicIdPartition) -> list[str]:
        return sorted(await self._list(partition_key_prefix(self.prefix, topic_id_partition)))

    async def delete_partition(self, topic_id_partition: TopicIdPartition) -> None:
        for segment_id in [s for s in self._manifests if s.topic_id_partition == topic_id_partition]:
            self._manifests.pop(segment_id, None)
        keys = await self.list_partition_objects(topic_id_partition)
        manifest_suffix = "." + ObjectType.MANIFEST.value
        # Manifests first, as for one segment: no segment looks complete half-deleted.
        await self._delete([k for k in keys if k.endswith(manifest_suffix)])
        await self._delete([k for k in keys if not k.endswith(manifest_suffix)])

    # -- whole objects beside the segments (the remote log metadata, metadata/bucket.py) --

    def _object_key(self, name: str) -> str:
        head = self.prefix.strip("/")
        return f"{head}/{name}" if head else name

    def object_location(self, name: str) -> str:
        return self._where(self._object_key(name))

    def _where(self, key: str) -> str:
        """The store's own name of `key` (the bucket's URL, a file's path)."""
        return key

    async def put_object(self, name: str, data: bytes) -> None:
        await self._put_bytes(self._object_key(name), data)

    async def get_object(self, name: str) -> bytes:
        return await self._get_bytes(self._object_key(name))

    async def list_objects(self, name_prefix: str) -> list[str]:
        cut = len(self._object_key(name_prefix)) - len(name_prefix)
        return sorted(key[cut:] for key in await self._list(self._object_key(name_prefix)))

    async def delete_objects(self, names: Iterable[str]) -> None:
        await self._delete([self._object_key(name) for name in names])

    # -- helpers ----------------------------------------------------------------

    def _forget(self, metadata: RemoteLogSegmentMetadata) -> None:
        self._manifests.pop(metadata.segment_id, None)

    async def _put_file(self, key: str, path: Path, cipher: SegmentCipher | None) -> ObjectEntry:
        """Store a local file, encrypted with `cipher` if given; returns its manifest entry."""
        try:
            size = (await asyncio.to_thread(path.stat)).st_size
        except OSError as e:
            raise _unreadable(path, e) from e
        if cipher is None:
            return await self._put_stream(key, _file_pieces(path, size, PUT_PIECE_BYTES), size)
        sealed = cipher.object(ObjectType.of_key(key).value, size)
        stored = await self._put_stream(key, sealed.seal_pieces(_file_pieces(path, size, sealed.chunk_bytes)),
                                        sealed.stored_size)
        return ObjectEntry(size, stored.crc32c)

    def _object_cipher(self, manifest: Manifest, metadata: RemoteLogSegmentMetadata,
                       object_type: ObjectType) -> ObjectCipher | None:
        """The cipher of an object of an encrypted segment; None for a plaintext one."""
        if manifest.encryption is None:
            if self.keys.required:
                self.keys.refuse_unencrypted(_segment_name(metadata))
            return None
        cipher = self.keys.open_segment(metadata.segment_id.id, manifest.encryption, _segment_name(metadata))
        return cipher.object(object_type.value, _entry(manifest, metadata, object_type).size)

    async def _manifest(self, metadata: RemoteLogSegmentMetadata) -> Manifest:
        cached = self._manifests.get(metadata.segment_id)
        if cached is not None:
            return cached
        key = self._key(metadata, ObjectType.MANIFEST)
        segment = _segment_name(metadata)
        try:
            data = await self._get_bytes(key)
        except RemoteResourceNotFound:
            # Objects without a manifest: a copy or a restore that has not finished (or a
            # delete that never did). Not a segment to serve, but nothing in it is known
            # to be damaged: a missing object, not a corrupt one.
            if await self._list(segment_key_prefix(self.prefix, metadata)):
                raise RemoteSegmentNotFound(f"copy of {segment} incomplete: no manifest {key}") from None
            raise RemoteSegmentNotFound(f"{segment} is not in remote storage") from None
        manifest = Manifest.decode(data, name=key)
        if manifest.segment_id != metadata.segment_id.id:
            raise CorruptRemoteSegment(f"{key} belongs to segment {manifest.segment_id}")
        self._manifests[metadata.segment_id] = manifest
        return manifest

    async def _verify_object(self, key: str, stored_size: int, crc: int, check_crc: bool) -> None:
        if check_crc:
            found = await self._stored_checksum(key)
            size, recorded = found if found is not None else (None, None)
        else:
            size, recorded = await self._object_size(key), None
        if size is None:
            raise RemoteObjectMismatch(key, RemoteObjectMismatch.MISSING, f"{key} is in the manifest but missing")
        if size != stored_size:
            raise RemoteObjectMismatch(key, RemoteObjectMismatch.SIZE,
                                       f"{key}: size {size}, manifest says {stored_size}")
        if check_crc:
            # What the store recorded at upload, or else what it returns now.
            actual = recorded if recorded is not None else (await self._checksum(key, size)).crc32c if size else 0
            if actual != crc:
                how = "recorded by the store" if recorded is not None else "read back"
                raise RemoteObjectMismatch(key, RemoteObjectMismatch.CHECKSUM,
                                           f"{_mismatch(key, size, actual, stored_size, crc)} ({how})")

    async def _checksum(self, key: str, size: int) -> ObjectEntry:
        crc = Crc32cAccumulator()
        async with self._open_range(key, 0, size - 1) as (_, chunks):
            async for chunk in chunks:
                crc.update(chunk)
        return crc.entry()


def _retrieved(task: asyncio.Task[bytes]) -> None:
    """A task whose result nobody waits for any more: its error is not one to report."""
    if not task.cancelled():
        task.exception()


async def _verified_blocks(chunks: AsyncGenerator[bytes | memoryview, None], key: str, entry: ObjectEntry, first: int,
                           start: int, last: int) -> AsyncGenerator[bytes | memoryview, None]:
    """The bytes [start, last] of a read that began at block boundary `first`, each block
    compared with its CRC-32C in the manifest before any of it is passed on.

    Whole blocks inside a chunk are checked and passed on as views of it; only a block
    split between two chunks is copied together. Every block before a corrupt one is
    passed on before the error is raised, so a reader keeps the intact bytes in front of it.
    """
    block_bytes = entry.block_bytes
    end = min(entry.size, (last // block_bytes + 1) * block_bytes)  # where the read stops
    position, pending = first, bytearray()

    def checked(block: bytes | memoryview) -> memoryview | None:
        index = position // block_bytes
        if crc32c.crc32c(block) != entry.blocks[index]:
            raise CorruptRemoteSegment(f"{key}: block {index} (bytes {position}-{position + len(block) - 1}) "
                                       "fails its CRC-32C in the manifest")
        low, high = max(start, position), min(last + 1, position + len(block))
        return memoryview(block)[low - position:high - position] if low < high else None

    async for chunk in chunks:
        view = memoryview(chunk)
        if not pending and start <= position and position + len(view) <= last + 1 \
                and (len(view) % block_bytes == 0 or position + len(view) == end):
            # The chunk is whole blocks, all wanted: checked, and passed on as it came.
            whole = view
            try:
                while view:
                    checked(view[:block_bytes])
                    position += len(view[:block_bytes])
                    view = view[block_bytes:]
            except CorruptRemoteSegment:
                if len(view) < len(whole):  # the blocks checked before the corrupt one
                    yield whole[:len(whole) - len(view)]
                raise
            yield chunk
            continue
        if pending:  # complete the block the previous chunk began
            need = min(block_bytes, end - position) - len(pending)
            pending += view[:need]
            view = view[need:]
            if position + len(pending) < min(position + block_bytes, end):
                continue
            part = checked(bytes(pending))
            if part is not None:
                yield part
            position += len(pending)
            pending = bytearray()
        # A block is whole at block_bytes, or where the read ends (the object's last block).
        while view and position < end and (len(view) >= block_bytes or position + len(view) >= end):
            block = view[:min(block_bytes, end - position)]
            part = checked(block)
            if part is not None:
                yield part
            position += len(block)
            view = view[len(block):]
        if view:
            pending += view


def _stored_span(entry: ObjectEntry, sealed: ObjectCipher | None, start: int, last: int) -> tuple[int, int]:
    """The stored bytes [first, stop) a read of bytes [start, last] fetches. Encrypted, the
    range grows to whole chunks, each opened before any of its bytes is yielded. With block
    checksums it grows to whole blocks, each checked likewise; without (older manifests) it
    gets the size check only."""
    if sealed is not None:
        return sealed.stored_range(start, last)
    if entry.blocks:
        block = entry.block_bytes
        return start // block * block, min(entry.size, (last // block + 1) * block)
    return start, last + 1


def _checked(chunks: AsyncGenerator[bytes | memoryview, None], key: str, entry: ObjectEntry,
             sealed: ObjectCipher | None, first: int, start: int, last: int, target: memoryview | None,
             into: memoryview | None) -> AsyncGenerator[bytes | memoryview, None]:
    """The plaintext bytes [start, last] of the stored bytes from `first` on, checked (or
    opened) as they come; `target` is where the store reads them, if it reads in place."""
    if target is not None:
        # Whole blocks (or sealed chunks) at a time, so that none is split between two
        # pieces and copied together to be checked or opened.
        step = sealed.chunk_bytes + TAG_BYTES if sealed is not None else entry.block_bytes if entry.blocks else 1
        chunks = _in_place(chunks, target, step, key)
    if sealed is not None:
        return sealed.open_range(chunks, start, last, key, into)
    if entry.blocks:
        return _verified_blocks(chunks, key, entry, first, start, last)
    return chunks


class _Pieces:
    """One response's body shared by consecutive reads: `take(n)` yields its next `n`
    bytes, splitting a piece that runs past them (a view, not a copy)."""

    def __init__(self, chunks: AsyncGenerator[bytes | memoryview, None]) -> None:
        self._chunks = chunks
        self._left: memoryview | None = None

    async def take(self, size: int) -> AsyncGenerator[bytes | memoryview, None]:
        while size > 0:
            if self._left is not None:
                piece, self._left = self._left, None
            else:
                try:
                    piece = memoryview(await anext(self._chunks))
                except StopAsyncIteration:
                    return  # a short body: the size checks name it
            if len(piece) > size:
                piece, self._left = piece[:size], piece[size:]
            size -= len(piece)
            yield piece


async def _in_place(chunks: AsyncGenerator[bytes | memoryview, None], target: memoryview,
                    step: int, key: str) -> AsyncGenerator[memoryview, None]:
    """The bytes a store read for `target`, as views of `target` ending at multiples of
    `step` (or at the end): a store that reads into `target` yields views of it in order,
    in pieces of any size, and they stay where they are; one that does not is copied there."""
    filled = passed = 0
    async for chunk in chunks:
        size = len(chunk)
        if filled + size > len(target):
            raise CorruptRemoteSegment(f"{key}: more bytes than the {len(target)} asked for")
        if not (isinstance(chunk, memoryview) and chunk.obj is target.obj):
            target[filled:filled + size] = chunk
        filled += size
        ready = filled if filled == len(target) else filled - filled % step
        if ready > passed:
            yield target[passed:ready]
            passed = ready
    if filled > passed:
        yield target[passed:filled]  # a short read: the size checks after this name it


async def _fill(buffer: memoryview, stream: AsyncGenerator[bytes | memoryview, None], metadata: RemoteLogSegmentMetadata,
                start: int) -> None:
    """`buffer` filled from `stream`; corrupt data raises CorruptRangeRead telling how much
    of the buffer was filled, checked, before it."""
    filled = 0
    async with contextlib.aclosing(stream):
        try:
            async for part in stream:
                filled = _copy_into(buffer, filled, part, metadata)
        except CorruptRemoteSegment as e:
            raise CorruptRangeRead(filled, e) from e
    _check_filled(buffer, filled, metadata, start)


def _copy_into(buffer: memoryview, filled: int, part: bytes | memoryview, metadata: RemoteLogSegmentMetadata) -> int:
    """`part` placed after the `filled` bytes of `buffer`; the new fill. A view of the
    buffer's own memory is a part the store read there, in order: already in place."""
    size = len(part)
    if filled + size > len(buffer):
        raise CorruptRemoteSegment(f"segment {metadata.segment_id.id}: more bytes than the {len(buffer)} asked for")
    if not (isinstance(part, memoryview) and part.obj is buffer.obj):
        buffer[filled:filled + size] = part
    return filled + size


def _check_filled(buffer: memoryview, filled: int, metadata: RemoteLogSegmentMetadata, start: int) -> None:
    if filled != len(buffer):
        raise CorruptRemoteSegment(f"segment {metadata.segment_id.id}: {filled} bytes from position {start}, "
                                   f"expected {len(buffer)}")


def _entry(manifest: Manifest, metadata: RemoteLogSegmentMetadata, object_type: ObjectType) -> ObjectEntry:
    entry = manifest.entry(object_type.value)
    if entry is None:
        raise CorruptRemoteSegment(f"manifest of segment {metadata.segment_id.id} lists no {object_type.value}")
    return entry


def _mismatch(key: str, size: int, crc: int, expected_size: int, expected_crc: int) -> str:
    return f"{key}: size {size} CRC-32C {crc:#010x}, manifest says size {expected_size} CRC-32C {expected_crc:#010x}"


def _unreadable(path: Path, error: OSError) -> RemoteStorageError:
    # The segment to copy is the caller's; its absence is no missing remote object.
    return RemoteStorageError(f"cannot read local file {path}: {error}", retriable=False)


def _file_pieces(path: Path, size: int, piece_bytes: int) -> Iterator[bytes]:
    """A local file in pieces of `piece_bytes` (the last may be short); it must hold the
    `size` bytes it had when the copy began (the manifest, and encryption, count on it)."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise _unreadable(path, e) from e
    read = 0
    with f:
        while True:
            try:
                piece = f.read(piece_bytes)  # buffered: whole pieces until the end
            except OSError as e:
                raise _unreadable(path, e) from e
            if not piece:
                break
            read += len(piece)
            if read > size:
                break
            yield piece
    if read != size:
        raise RemoteStorageError(f"local file {path} changed while it was copied: it held {size} bytes, "
                                 f"then {read}{'+' if read > size else ''}", retriable=False)
