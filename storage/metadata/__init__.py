"""RemoteLogMetadataManager: where the remote log's segment metadata lives (KIP-405).

The backends share one in-memory cache (`cache.py`) and one record format (`serde.py`):

- `file_store.FileRemoteLogMetadataManager(directory)`: one local append-only file; the
  embedded default.
- `topic_store.TopicRemoteLogMetadataManager(bootstrap_servers, directory=...)`: the
  `__remote_log_metadata` topic, materialized per user partition into local flat files.
- `bucket.BucketRemoteLogMetadataManager(rsm)`: read-only, what the pipeline published
  into the remote store (`bucket.publish`), for readers with only the store's credentials.

Writes are async and return once the record is durable in the backend and visible to
this manager's own reads. Reads are synchronous lookups in memory; they raise
MetadataNotReady while the partition's metadata is still loading (Kafka answers
REPLICA_NOT_AVAILABLE then). A manager made for some partitions only (`partitions=`, a
copy task's) keeps only their metadata: a start costs what they hold, not the whole store.

A backend that can find its store without any metadata, or with an object that does not
decode, says so in `problem` (a `MetadataProblem`) instead of raising: it keeps serving
what it read last, if anything, and `observe_problems` tells the proxy's metrics.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from ..errors import MetadataNotReady, RemoteLogMetadataError
from ..model import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from .partition import PartitionState
from .cache import DuplicateSegment, EpochChain, RemoteLogMetadataCache, UnknownSegment, is_segment_within_lineage
from .serde import MetadataDecodeError, RemoteLogMetadata, RemoteLogTruncation, topic_id_partition_of

__all__ = [
    "DuplicateSegment",
    "EpochChain",
    "LoadedAtStart",
    "MetadataDecodeError",
    "MetadataProblem",
    "ProblemKind",
    "RemoteLogMetadataManager",
    "RemoteLogTruncation",
    "UnknownSegment",
    "is_segment_within_lineage",
]


class ProblemKind(enum.Enum):
    """What is wrong with a metadata store as a whole; the value is the metrics' label value."""

    NO_METADATA = "no_metadata"  # nothing published where the configuration points
    DAMAGED = "damaged"  # an object does not decode, is missing or is truncated


@dataclass(frozen=True, slots=True)
class MetadataProblem:
    kind: ProblemKind
    location: str  # the object, or the folder, it concerns (with the bucket and prefix)
    detail: str

    def __str__(self) -> str:
        return self.detail


class RemoteLogMetadataManager(abc.ABC):
    """Kafka's `RemoteLogMetadataManager`, asyncio flavoured.

    A backend implements `_publish` (make one checked record durable, then visible in
    `self._cache`), `_is_ready`, `start`, `wait_until_ready` and `close`; the rules and the
    lookups are shared here. With `partitions`, the backend keeps (and this manager reads and
    writes) only those partitions' metadata; any other is an error.
    """

    def __init__(self, partitions: Iterable[TopicIdPartition] | None = None) -> None:
        self._cache = RemoteLogMetadataCache()
        self.scope: frozenset[TopicIdPartition] | None = frozenset(partitions) if partitions is not None else None
        self._problem: MetadataProblem | None = None
        self._problem_observers: list[Callable[[MetadataProblem | None], None]] = []

    def in_scope(self, tp: TopicIdPartition) -> bool:
        return self.scope is None or tp in self.scope

    def _check_scope(self, tp: TopicIdPartition) -> None:
        if not self.in_scope(tp):
            raise RemoteLogMetadataError(f"this metadata manager keeps only {sorted(map(str, self.scope or ()))}, "
                                         f"not {tp}")

    # ------------------------------------------------------------------ lifecycle

    @abc.abstractmethod
    async def start(self) -> None:
        """Loads what the backend holds; reads work once the partition is ready."""

    @abc.abstractmethod
    async def wait_until_ready(self, tp: TopicIdPartition, timeout: float) -> None:
        """Returns once `tp`'s metadata is loaded; raises MetadataNotReady after `timeout` seconds."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @property
    def needs_refresh(self) -> bool:
        """True when other processes write the store this manager reads and it sees
        their records only when `refresh` is called (a file read by the proxy); a
        backend that follows its store by itself (the topic's consumer) says False."""
        return False

    async def refresh(self) -> int:
        """Applies the records other processes added since the last call; returns how many."""
        return 0

    @property
    def problem(self) -> MetadataProblem | None:
        """What is wrong with the store as a whole now (see the module's docstring); None when nothing is."""
        return self._problem

    def observe_problems(self, observer: Callable[[MetadataProblem | None], None]) -> None:
        """Calls `observer` with `problem` now and whenever it changes."""
        self._problem_observers.append(observer)
        observer(self._problem)

    def _set_problem(self, problem: MetadataProblem | None) -> bool:
        """Records `problem`; True when it differs from the one before."""
        if problem == self._problem:
            return False
        self._problem = problem
        for observer in self._problem_observers:
            observer(problem)
        return True

    async def __aenter__(self) -> RemoteLogMetadataManager:
        try:
            await self.start()
        except BaseException:
            await self.close()  # what the start opened (a store's client) is not left open
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ writes

    @abc.abstractmethod
    async def _publish(self, record: RemoteLogMetadata) -> None:
        """Checks `record` against the current state (raising on a broken rule), makes it
        durable, and returns once `self._cache` shows it."""

    async def _write(self, record: RemoteLogMetadata) -> None:
        self._check_scope(topic_id_partition_of(record))
        await self._publish(record)

    async def add_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Adds a segment in COPY_SEGMENT_STARTED (else IllegalStateTransition); a known id is DuplicateSegment."""
        await self._write(metadata)

    async def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> None:
        """Moves a segment to `update.state`: IllegalStateTransition if not allowed, UnknownSegment if unknown."""
        await self._write(update)

    async def put_partition_delete(self, metadata: RemotePartitionDeleteMetadata) -> None:
        """Moves a partition's delete state (MARKED -> STARTED -> FINISHED), else IllegalStateTransition."""
        await self._write(metadata)

    async def record_truncation(
        self, tp: TopicIdPartition, offset: int, *, leader_epoch: int, event_timestamp_ms: int | None = None
    ) -> None:
        """The partition's remote log diverged from the leader's lineage at `offset` (an unclean
        election): segments ending below it are kept, those starting at or above it go to
        DELETE_SEGMENT_STARTED, one straddling it is served only below it."""
        if event_timestamp_ms is None:
            event_timestamp_ms = int(time.time() * 1000)
        await self._write(RemoteLogTruncation(tp, offset, leader_epoch, event_timestamp_ms))

    # ------------------------------------------------------------------ reads

    @abc.abstractmethod
    def _is_ready(self, tp: TopicIdPartition) -> bool: ...

    @abc.abstractmethod
    def is_loaded(self) -> bool:
        """True once every partition's metadata this manager keeps is loaded: from then on
        a partition `partitions()` does not name has no remote log (yet), where before it
        may be one still loading."""

    @property
    def partitions_version(self) -> int:
        """Changes whenever a partition appears or its delete state changes (not with its
        segments): an index of `partitions()` built at one version holds while it stays."""
        return self._cache.partitions_version

    def _ready_cache(self, tp: TopicIdPartition) -> RemoteLogMetadataCache:
        self._check_scope(tp)
        if not self._is_ready(tp):
            raise MetadataNotReady(f"remote log metadata of {tp} is not loaded yet")
        return self._cache

    def segment_for(
        self, tp: TopicIdPartition, offset: int, leader_epoch: int, epoch_chain: EpochChain | None = None
    ) -> RemoteLogSegmentMetadata | None:
        """Kafka's `remoteLogSegmentMetadata(tp, epoch, offset)`: the COPY_SEGMENT_FINISHED segment
        holding `offset` in `leader_epoch`; with `epoch_chain`, only one within that lineage."""
        return self._ready_cache(tp).segment_for(tp, offset, leader_epoch, epoch_chain)

    def segments_from(self, tp: TopicIdPartition, offset: int) -> Iterator[RemoteLogSegmentMetadata]:
        """`list_segments(tp)` from the first segment ending at or after `offset`, found by bisection
        (the segments holding `offset` first, then those after it): a reader that needs one
        segment stops early. Iterate it at once (it raises RuntimeError if the partition changes)."""
        return self._ready_cache(tp).segments_from(tp, offset)

    def highest_offset_for_epoch(self, tp: TopicIdPartition, leader_epoch: int) -> int | None:
        return self._ready_cache(tp).highest_offset_for_epoch(tp, leader_epoch)

    def end_offset_for_epoch(self, tp: TopicIdPartition, leader_epoch: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch answer from the remote log alone: (the largest epoch <=
        `leader_epoch` it holds, that epoch's end offset); (-1, -1) for an epoch past every one it
        holds. Kafka's `LeaderEpochFileCache.endOffsetFor`, see `lineage.end_offset_for`."""
        return self._ready_cache(tp).end_offset_for_epoch(tp, leader_epoch)

    def list_segments(self, tp: TopicIdPartition, leader_epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        """Segments in any state but DELETE_SEGMENT_FINISHED (of `leader_epoch` if given), by start offset."""
        return self._ready_cache(tp).list_segments(tp, leader_epoch)

    def segments_in_lineage(
        self, tp: TopicIdPartition, epoch_chain: EpochChain, log_end_offset: int | None = None
    ) -> list[RemoteLogSegmentMetadata]:
        return self._ready_cache(tp).segments_in_lineage(tp, epoch_chain, log_end_offset)

    def partition_delete_state(self, tp: TopicIdPartition) -> RemotePartitionDeleteState | None:
        return self._ready_cache(tp).partition_delete_state(tp)

    def log_start_offset(self, tp: TopicIdPartition) -> int | None:
        return self._ready_cache(tp).log_start_offset(tp)

    def log_end_offset(self, tp: TopicIdPartition) -> int | None:
        return self._ready_cache(tp).log_end_offset(tp)

    def partitions(self) -> list[TopicIdPartition]:
        """User partitions with any remote log metadata loaded so far."""
        return self._cache.partitions()

    def partition_states(self) -> list[PartitionState]:
        """The whole state of every partition loaded (what `bucket.publish` writes): read them
        on the event loop's thread, and change none."""
        return self._cache.partition_states()


class LoadedAtStart(RemoteLogMetadataManager):
    """A store that loads every partition's metadata when it starts (`_started` set then):
    each partition is ready once the whole store is, until it is closed."""

    _started: asyncio.Event
    _closed: bool

    def _source(self) -> str:
        """Where the metadata is loaded from, for the error that says it is not yet."""
        raise NotImplementedError

    def _is_ready(self, tp: TopicIdPartition) -> bool:
        return self.is_loaded()

    def is_loaded(self) -> bool:
        return self._started.is_set() and not self._closed

    async def wait_until_ready(self, tp: TopicIdPartition, timeout: float) -> None:
        self._check_scope(tp)
        try:
            await asyncio.wait_for(self._started.wait(), timeout)
        except TimeoutError:
            raise MetadataNotReady(f"remote log metadata in {self._source()} not loaded after {timeout}s") from None
