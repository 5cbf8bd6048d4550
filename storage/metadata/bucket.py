"""Remote log metadata in the remote store itself: published by the pipeline, read by
`BucketRemoteLogMetadataManager` (`remote.log.metadata.backend=remote`) with bucket
credentials only: a read replica in front of another cluster, or a fast first start.

Objects, under the store's key prefix (`<prefix>/__remote_log_metadata/`):

    head                          JSON: format, generation, published_ms, the sections
                                  objects in the order they apply, the index, and each
                                  tiered topic's partition count in the origin cluster
                                  (`topic_partitions`; absent from heads published before)
    <generation>-<n>.sections     "RLMBKT01", partition count (uint32), then one
                                  `snapshot.py` section (a partition's whole state) each
    <generation>.index            (topic id, partition, CRC of its section) per partition
                                  published: what the next publication compares against

A compaction writes the state of every partition as a few sections objects (the snapshot,
fetched concurrently); a publication in between writes one object with the partitions
whose state changed since (segments added, moved between COPY/DELETE states, cut by a
truncation; a partition's deletion), which a reader installs over what it has. The head
names all of them and is written last, replacing the one before: a reader that sees a head
sees every object it names, and never one a failed publication left half-written. Objects
no head names any more are removed after a compaction (those of the head replaced stay,
for readers that read it just before); a reader that misses one reads the head again.

A refresh with nothing published costs one GET (the head), whatever the partition count.
Publications come from the pipeline after its commits, from its metadata store's state,
so the bucket is never ahead of that store; one that failed is made good by the next,
which compares against what the bucket's index says, not against what it meant to write.
One publisher at a time (the pipeline's lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import crc32c

from ..errors import MetadataNotReady, RemoteLogMetadataError, RemoteResourceNotFound, RemoteStorageError
from ..model import TopicIdPartition
from . import LoadedAtStart, MetadataProblem, ProblemKind
from .cache import RemoteLogMetadataCache
from .partition import PartitionState
from .serde import MetadataDecodeError, RemoteLogMetadata
from .snapshot import encode_partition, read_snapshot_partitions

if TYPE_CHECKING:
    from ..rsm import RemoteStorageManager

log = logging.getLogger(__name__)

FOLDER = "__remote_log_metadata"
HEAD = "head"
FORMAT = 1
SECTIONS_MAGIC = b"RLMBKT01"
_SECTIONS_HEADER = struct.Struct("<8sI")
_INDEX_ENTRY = struct.Struct("<16siI")
# A snapshot is cut into objects of about this size, fetched concurrently at a start.
SNAPSHOT_OBJECT_BYTES = 4 << 20
# A compaction comes once the change objects are this many, or outweigh the snapshot.
MAX_CHANGE_OBJECTS = 16
FETCH_CONCURRENCY = 16
# Heads read again when an object one named was removed meanwhile (two compactions).
_HEAD_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class StoredObject:
    name: str
    size: int
    crc: int


@dataclass(frozen=True, slots=True)
class Head:
    generation: int
    published_ms: int
    objects: tuple[StoredObject, ...]  # sections objects, in the order they apply
    snapshot_objects: int  # how many of them, first, are the snapshot
    index: StoredObject | None
    # Tiered topic -> its partition count in the origin cluster's metadata, tiered or not
    # (a read replica's topic needs them all); None in a head published without them.
    topic_partitions: Mapping[str, int] | None = None

    def encode(self) -> bytes:
        def obj(o: StoredObject) -> dict[str, object]:
            return {"name": o.name, "bytes": o.size, "crc32c": o.crc}

        doc = {"format": FORMAT, "generation": self.generation, "published_ms": self.published_ms,
               "snapshot_objects": self.snapshot_objects, "objects": [obj(o) for o in self.objects],
               "index": obj(self.index) if self.index else None}
        if self.topic_partitions is not None:
            doc["topic_partitions"] = dict(sorted(self.topic_partitions.items()))
        return json.dumps(doc).encode()

    @classmethod
    def decode(cls, data: bytes) -> Head:
        try:
            doc = json.loads(data)
            if doc["format"] != FORMAT:
                raise MetadataDecodeError(f"remote log metadata head of format {doc['format']}, not {FORMAT}")

            def obj(o: dict[str, object]) -> StoredObject:
                return StoredObject(str(o["name"]), int(o["bytes"]), int(o["crc32c"]))  # type: ignore[call-overload]  # JSON numbers

            counts = doc.get("topic_partitions")
            return cls(int(doc["generation"]), int(doc["published_ms"]), tuple(obj(o) for o in doc["objects"]),
                       int(doc["snapshot_objects"]), obj(doc["index"]) if doc["index"] else None,
                       None if counts is None else {str(name): int(n) for name, n in counts.items()})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MetadataDecodeError(f"remote log metadata head does not decode: {exc}") from exc


class BucketMetadata:
    """The metadata folder of one store: reads and writes whole objects, checked against the head."""

    def __init__(self, rsm: RemoteStorageManager) -> None:
        self.rsm = rsm

    @staticmethod
    def key(name: str) -> str:
        """The object's name below the store's key prefix."""
        return f"{FOLDER}/{name}"

    async def head(self) -> Head | None:
        try:
            return Head.decode(await self.rsm.get_object(self.key(HEAD)))
        except RemoteResourceNotFound:
            return None

    async def read(self, o: StoredObject) -> bytes:
        data = await self.rsm.get_object(self.key(o.name))
        if len(data) != o.size or crc32c.crc32c(data) != o.crc:
            raise MetadataDecodeError(f"{self.key(o.name)} is not the object its head names")
        return data

    async def write(self, name: str, data: bytes) -> StoredObject:
        await self.rsm.put_object(self.key(name), data)
        return StoredObject(name, len(data), crc32c.crc32c(data))


# ---------------------------------------------------------------------------- formats


def encode_sections(sections: list[bytes]) -> bytes:
    return b"".join([_SECTIONS_HEADER.pack(SECTIONS_MAGIC, len(sections)), *sections])


def decode_sections(data: bytes, keep: Callable[[TopicIdPartition], bool] | None = None) -> list[PartitionState]:
    if len(data) < _SECTIONS_HEADER.size:
        raise MetadataDecodeError("remote log metadata object is shorter than its header")
    magic, count = _SECTIONS_HEADER.unpack_from(data)
    if magic != SECTIONS_MAGIC:
        raise MetadataDecodeError(f"not a remote log metadata sections object (magic {magic!r})")
    f = io.BytesIO(data)
    f.seek(_SECTIONS_HEADER.size)
    return list(read_snapshot_partitions(f, count, keep))


def encode_index(crcs: dict[TopicIdPartition, int]) -> bytes:
    return b"".join(_INDEX_ENTRY.pack(tp.topic_id.bytes, tp.partition, crc) for tp, crc in crcs.items())


def decode_index(data: bytes) -> dict[tuple[bytes, int], int]:
    """(topic id bytes, partition) -> CRC of the partition's section."""
    if len(data) % _INDEX_ENTRY.size:
        raise MetadataDecodeError("remote log metadata index is not whole entries")
    return {(topic_id, partition): crc for topic_id, partition, crc in _INDEX_ENTRY.iter_unpack(data)}


def _section_crc(section: bytes) -> int:
    return struct.unpack_from("<I", section, 4)[0]  # the body's CRC in the section header


def _cut(sections: list[bytes], size: int) -> list[list[bytes]]:
    """`sections` in runs of about `size` bytes (at least one run)."""
    runs: list[list[bytes]] = [[]]
    total = 0
    for s in sections:
        if runs[-1] and total + len(s) > size:
            runs.append([])
            total = 0
        runs[-1].append(s)
        total += len(s)
    return runs


# ---------------------------------------------------------------------------- publishing


@dataclass(frozen=True, slots=True)
class Publication:
    generation: int
    partitions_changed: int
    objects_written: int
    compacted: bool


async def publish(rsm: RemoteStorageManager, states: Iterable[PartitionState],
                  *, topic_partitions: Mapping[str, int] | None = None, now_ms: int | None = None,
                  snapshot_object_bytes: int = SNAPSHOT_OBJECT_BYTES) -> Publication:
    """Publishes `states` (every partition of the metadata store, read after its commits)
    into the store: the partitions that differ from what the bucket's index says, or a new
    snapshot of them all when one is due. The head is written last, and always (its
    `published_ms` tells readers the publisher is alive). It carries `topic_partitions`
    (the origin's partition count of each tiered topic) over the counts the head before
    carried: a topic this publication does not count (the cluster could not be read, the
    topic is no longer tiered) keeps the count published last."""
    bucket = BucketMetadata(rsm)
    head, published = await _published(bucket)
    sections = {p.tp: encode_partition(p) for p in states}
    crcs = {tp: _section_crc(s) for tp, s in sections.items()}
    changed = [s for tp, s in sections.items() if published.get((tp.topic_id.bytes, tp.partition)) != crcs[tp]]
    generation, objects, snapshot_objects = (head.generation + 1, head.objects, head.snapshot_objects) if head \
        else (await _next_generation(bucket), (), 0)
    changes = objects[snapshot_objects:]
    snapshot_bytes = sum(o.size for o in objects[:snapshot_objects])
    change_bytes = sum(o.size for o in changes) + sum(map(len, changed))
    compact = head is None or (bool(changed) and (
        len(changes) + 1 > MAX_CHANGE_OBJECTS or change_bytes > max(snapshot_bytes, snapshot_object_bytes)))
    written: list[StoredObject] = []
    if compact:
        runs = _cut(list(sections.values()), snapshot_object_bytes)
        written = list(await asyncio.gather(*(
            bucket.write(f"{generation:020d}-{n}.sections", encode_sections(run)) for n, run in enumerate(runs))))
        objects, snapshot_objects = tuple(written), len(written)
    elif changed:
        written = [await bucket.write(f"{generation:020d}-0.sections", encode_sections(changed))]
        objects += tuple(written)
    if head is not None and not changed:
        index = head.index
    else:
        index = await bucket.write(f"{generation:020d}.index", encode_index(crcs))
        written.append(index)
    counts = None if topic_partitions is None and (head is None or head.topic_partitions is None) else {
        **((head.topic_partitions or {}) if head else {}), **(topic_partitions or {})}
    new_head = Head(generation, now_ms if now_ms is not None else int(time.time() * 1000), objects,
                    snapshot_objects, index, counts)
    await rsm.put_object(bucket.key(HEAD), new_head.encode())  # last: the publication is whole now
    if compact and head is not None:
        await _remove_unnamed(bucket, (head, new_head))
    return Publication(generation, len(changed), len(written), compact)


async def _published(bucket: BucketMetadata) -> tuple[Head | None, dict[tuple[bytes, int], int]]:
    """The head and the index it names. A head or index that is damaged or missing is
    published over, whole: readers keep their last good state until then, and only a
    publication can mend what they read."""
    try:
        head = await bucket.head()
        return head, (decode_index(await bucket.read(head.index)) if head and head.index else {})
    except (MetadataDecodeError, RemoteResourceNotFound) as e:
        log.warning("the remote log metadata in %s cannot be read (%s): publishing every partition's state anew",
                    bucket.key(HEAD), e)
        return None, {}


async def _next_generation(bucket: BucketMetadata) -> int:
    """Above every generation an object in the folder carries, so that no reader takes a
    fresh snapshot for one it has applied."""
    folder = bucket.key("")
    generations = [int(n.removeprefix(folder).split("-")[0].split(".")[0])
                   for n in await bucket.rsm.list_objects(folder)
                   if n.removeprefix(folder)[:20].isdigit()]
    return max(generations, default=0) + 1


async def _remove_unnamed(bucket: BucketMetadata, heads: Iterable[Head]) -> None:
    """Removes the objects neither of `heads` names (best effort: the next compaction tries again)."""
    named = {HEAD} | {o.name for h in heads for o in (*h.objects, *([h.index] if h.index else []))}
    folder = bucket.key("")
    try:
        names = await bucket.rsm.list_objects(folder)
        await bucket.rsm.delete_objects(n for n in names if n.removeprefix(folder) not in named)
    except Exception as exc:  # noqa: BLE001 - unreferenced objects cost only space
        log.warning("removing old remote log metadata objects under %s failed: %s", folder, exc)


# ---------------------------------------------------------------------------- reading


class _ObjectUnreadable(Exception):
    """An object a head names that is missing or does not decode (`error`), at `location`."""

    def __init__(self, location: str, error: Exception) -> None:
        super().__init__(f"{location}: {error}")
        self.location = location
        self.error = error


class BucketRemoteLogMetadataManager(LoadedAtStart):
    """`remote.log.metadata.backend=remote`: the metadata the pipeline published into the
    store, read-only, followed every `refresh_interval_ms` (and on `refresh()`).

    Loaded once a head and every object it names have been read whole. Nothing published
    under the key prefix, or a head or object that is missing, truncated or does not
    decode, is a `problem` (one ERROR line when it starts, one INFO line when it ends), not
    an exception: what was read before, if anything, is served meanwhile; before the first
    whole read nothing is loaded, so every partition is not ready (REPLICA_NOT_AVAILABLE)."""

    def __init__(self, rsm: RemoteStorageManager, *, refresh_interval_ms: int = 5000,
                 partitions: Iterable[TopicIdPartition] | None = None, owns_store: bool = False) -> None:
        super().__init__(partitions)
        self.bucket = BucketMetadata(rsm)
        self.refresh_interval_ms = refresh_interval_ms
        self.owns_store = owns_store
        self.head: Head | None = None
        self._applied: tuple[StoredObject, ...] = ()
        self._started = asyncio.Event()
        self._refresh_lock = asyncio.Lock()
        self._follower: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def published_ms(self) -> int | None:
        """When the head read last was published (the publisher's clock); None before any."""
        return self.head.published_ms if self.head else None

    def location(self, name: str = HEAD) -> str:
        """Where the metadata object `name` is (bucket and key prefix included)."""
        return self.bucket.rsm.object_location(self.bucket.key(name))

    async def start(self) -> None:
        """Loads what is published. Neither a store that cannot be reached now (a retriable
        error) nor metadata that is missing or damaged (`problem`) stops a start: the
        metadata is not ready (REPLICA_NOT_AVAILABLE to clients) until a refresh, every
        `refresh_interval_ms`, reads it whole; any other error (no such bucket, access
        denied) does."""
        if self._follower is not None:
            return
        try:
            await self.refresh()
        except RemoteStorageError as e:
            if not e.retriable:
                raise
            log.warning("remote log metadata in %s cannot be read yet, its partitions are not ready until it "
                        "is (read again every %d ms): %s", self.location(), self.refresh_interval_ms, e)
        self._follower = asyncio.get_running_loop().create_task(self._follow())

    async def wait_until_ready(self, tp: TopicIdPartition, timeout: float) -> None:
        """As LoadedAtStart's, but at once with the problem when nothing was ever read whole
        and the last read found the metadata missing or damaged."""
        self._check_scope(tp)
        if not self.is_loaded() and self.problem is not None:
            raise MetadataNotReady(str(self.problem))
        await super().wait_until_ready(tp, timeout)

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval_ms / 1000)
            try:
                await self.refresh()
            except RemoteStorageError as e:  # the store: one line, read again at the next interval
                log.warning("reading the remote log metadata in %s failed, read again in %d ms: %s",
                            self.location(), self.refresh_interval_ms, e)
            except Exception:  # noqa: BLE001 - not the store's: a fault of ours; serving goes on
                log.exception("refreshing the remote log metadata from %s failed", self.location())

    async def refresh(self) -> int:
        """Reads the head; when it names objects not applied yet, fetches and installs them.
        Returns how many partitions changed. Metadata missing or damaged sets `problem`
        (the state read before stays); errors of the store itself raise."""
        async with self._refresh_lock:
            try:
                changed = await self._read()
            except _ObjectUnreadable as e:
                self._report(self._damaged(e.location, e.error))
                return 0
            if self.head is None:
                self._report(MetadataProblem(ProblemKind.NO_METADATA, self.location(""), (
                    f"no remote log metadata under {self.location('')}: {self.location()} does not exist "
                    f"(remote.log.storage.* and remote.log.storage.key.prefix name another place than the origin's "
                    f"pipeline publishes to, or it never published); read replica partitions are answered "
                    f"REPLICA_NOT_AVAILABLE")))
            return changed

    async def _read(self) -> int:
        """One refresh (see `refresh`); raises _ObjectUnreadable."""
        for attempt in range(_HEAD_ATTEMPTS):
            try:
                head = await self.bucket.head()
            except MetadataDecodeError as e:
                raise _ObjectUnreadable(self.location(), e) from e
            if head is None:
                if self.head is not None:  # gone after it was read: what it named is served
                    self._report(MetadataProblem(ProblemKind.NO_METADATA, self.location(), (
                        f"{self.location()} is gone: serving remote log metadata generation {self.head.generation} "
                        f"read before, until a head is published again")))
                return 0
            if self.head is not None and head.generation == self.head.generation:
                self._report(None)
                return 0
            try:
                changed = await self._apply(head)
            except _ObjectUnreadable as e:
                if not isinstance(e.error, RemoteResourceNotFound) or attempt + 1 == _HEAD_ATTEMPTS:
                    raise
                log.info("an object of remote log metadata generation %d is gone: reading the head again",
                         head.generation)
                continue
            self._started.set()
            self._report(None)
            return changed
        return 0

    def _damaged(self, location: str, error: Exception) -> MetadataProblem:
        served = (f"serving generation {self.head.generation} read before" if self.head is not None
                  else "read replica partitions are answered REPLICA_NOT_AVAILABLE")
        return MetadataProblem(ProblemKind.DAMAGED, location,
                               f"remote log metadata object {location} cannot be read ({error}): {served}, until "
                               f"a publication replaces it")

    def _report(self, problem: MetadataProblem | None) -> None:
        """Records `problem`, with a log line when it starts, changes or ends."""
        before = self.problem
        if not self._set_problem(problem):
            return
        if problem is not None:
            log.error("%s", problem)
        elif before is not None:
            log.info("remote log metadata in %s is read again (generation %d)", self.location(),
                     self.head.generation if self.head else 0)

    async def _apply(self, head: Head) -> int:
        known = len(self._applied)
        incremental = head.objects[:known] == self._applied and self.head is not None
        fresh = head.objects[known:] if incremental else head.objects
        keep = None if self.scope is None else self.in_scope
        semaphore = asyncio.Semaphore(FETCH_CONCURRENCY)

        async def load(o: StoredObject) -> list[PartitionState]:
            try:
                async with semaphore:
                    data = await self.bucket.read(o)
                return await asyncio.to_thread(decode_sections, data, keep)
            except (MetadataDecodeError, RemoteResourceNotFound) as e:
                raise _ObjectUnreadable(self.location(o.name), e) from e

        loaded = await asyncio.gather(*(load(o) for o in fresh))
        cache = self._cache if incremental else RemoteLogMetadataCache()
        changed = 0
        for states in loaded:  # in order: a later object's partition replaces an earlier one's
            for state in states:
                cache.install(state)
                changed += 1
        self._cache, self.head, self._applied = cache, head, head.objects
        return changed

    async def _publish(self, record: RemoteLogMetadata) -> None:
        raise RemoteLogMetadataError(
            "remote.log.metadata.backend=remote is read-only: the pipeline of the cluster that tiers these "
            "partitions publishes their metadata into the store")

    def _source(self) -> str:
        return self.location()

    async def close(self) -> None:
        self._closed = True
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        if self.owns_store:
            await self.bucket.rsm.close()


