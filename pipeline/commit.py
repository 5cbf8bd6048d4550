"""Commit on the driver: exactly one winner per range, and cleanup of everything else.

Spark reports one successful attempt per partition (`collect()`); its segments are the
winners. Each is verified in remote storage (every object present, sizes as in its
manifest) and moved to COPY_SEGMENT_FINISHED in offset order, each only if it starts
right after the current remote log end offset: never two FINISHED segments overlapping,
never a gap (the one allowed jump is the first segment after a gap the plan reported).
A winner that fails a check is not committed, nor is anything after it.

Every other COPY_SEGMENT_STARTED segment of the partition (a failed attempt, a
speculative duplicate, a run that crashed) is an orphan: DELETE_SEGMENT_STARTED ->
objects deleted -> DELETE_SEGMENT_FINISHED. A segment left in DELETE_SEGMENT_STARTED by a
crash during a delete is finished by remote retention, which runs later in every pass.

At the end of every pass the metadata store's state is published into the remote store
(`publishing_metadata`), after its commits: the bucket is never ahead of the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from tierproxy.storage.errors import RemoteLogMetadataError, RemoteStorageError
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.metadata.bucket import publish
from tierproxy.storage.model import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tierproxy.storage.rsm import RemoteStorageManager

from .failures import log_failure
from .plan import PartitionPlan
from .remote_retention import delete_segment

log = logging.getLogger(__name__)

S = RemoteLogSegmentState


class CommitError(RuntimeError):
    """A winner cannot be committed without breaking the remote log's continuity."""


@dataclass(slots=True)
class CommitResult:
    topic_id_partition: TopicIdPartition
    committed: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    cleaned: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    error: str | None = None
    cleanup_failed: bool = False  # deleting the other STARTED segments failed

    @property
    def bytes_committed(self) -> int:
        return sum(m.segment_size_in_bytes for m in self.committed)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def wait_visible(
    rlmm: RemoteLogMetadataManager, tp: TopicIdPartition, ids: Iterable[RemoteLogSegmentId], timeout_s: float
) -> None:
    wanted = set(ids)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        await rlmm.refresh()  # what tasks in other processes wrote (file backend)
        missing = wanted - {m.segment_id for m in rlmm.list_segments(tp)}
        if not missing:
            return
        if asyncio.get_running_loop().time() >= deadline:
            raise CommitError(f"{tp}: metadata of {len(missing)} uploaded segment(s) not visible after {timeout_s}s")
        await asyncio.sleep(0.1)


async def clean_orphans(
    rlmm: RemoteLogMetadataManager,
    rsm: RemoteStorageManager,
    tp: TopicIdPartition,
    leader_epoch: int,
    *,
    keep: Iterable[RemoteLogSegmentId] = (),
) -> list[RemoteLogSegmentMetadata]:
    """Deletes every COPY_SEGMENT_STARTED segment of `tp` not in `keep`. Only safe while no
    copy of `tp` runs (the pipeline's lock)."""
    await rlmm.refresh()  # what tasks in other processes wrote (file backend)
    kept = set(keep)
    cleaned = []
    for m in rlmm.list_segments(tp):
        if m.state == S.COPY_SEGMENT_STARTED and m.segment_id not in kept:
            await delete_segment(rlmm, rsm, m, leader_epoch)
            cleaned.append(m)
    if cleaned:
        log.info("%s: cleaned %d orphan segment(s)", tp, len(cleaned))
    return cleaned


async def commit_partition(
    rlmm: RemoteLogMetadataManager,
    rsm: RemoteStorageManager,
    plan: PartitionPlan,
    winners: list[RemoteLogSegmentMetadata],
    *,
    visible_timeout_s: float = 30.0,
) -> CommitResult:
    """Marks the winning attempt's segments FINISHED in order, then cleans every other
    STARTED segment of the partition."""
    tp = plan.topic_id_partition
    result = CommitResult(tp)
    winners = sorted(winners, key=lambda m: m.start_offset)
    try:
        await wait_visible(rlmm, tp, (m.segment_id for m in winners), visible_timeout_s)
        for i, m in enumerate(winners):
            _check_continuity(rlmm.log_end_offset(tp), m, first_after_gap=(i == 0 and plan.gap))
            await rsm.verify_segment(m)
            await rlmm.update_remote_log_segment_metadata(
                RemoteLogSegmentMetadataUpdate(m.segment_id, _now_ms(), S.COPY_SEGMENT_FINISHED, plan.leader_epoch))
            result.committed.append(m)
    except (CommitError, RemoteStorageError, RemoteLogMetadataError) as e:
        result.error = str(e)  # the summary names the partition
        log.error("commit of %s stopped: %s", tp, e)
    # Winners not committed (after a failed check) are orphans like any other attempt's.
    try:
        result.cleaned = await clean_orphans(
            rlmm, rsm, tp, plan.leader_epoch, keep=(m.segment_id for m in result.committed))
    except (RemoteStorageError, RemoteLogMetadataError) as e:
        # Left as they are (never served); the next pass cleans them again.
        error = f"orphan cleanup failed: {log_failure(log, logging.ERROR, f'{tp}: orphan cleanup', e)}"
        result.cleanup_failed = True
        result.error = f"{result.error}; {error}" if result.error else error
    return result


def _check_continuity(remote_end: int | None, m: RemoteLogSegmentMetadata, *, first_after_gap: bool) -> None:
    if remote_end is None:
        return  # the partition's first remote segment
    expected = remote_end + 1
    if m.start_offset == expected or (first_after_gap and m.start_offset > expected):
        return
    kind = "overlaps" if m.start_offset < expected else "leaves a gap after"
    raise CommitError(
        f"segment {m.segment_id.id} [{m.start_offset}, {m.end_offset}] {kind} the remote log ending at {remote_end}")



@contextlib.asynccontextmanager
async def publishing_metadata(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager,
                              failed: Callable[[str], None], *, skip: bool = False,
                              topic_partitions: Callable[[], Awaitable[Mapping[str, int]]] | None = None,
                              ) -> AsyncIterator[None]:
    """Around a pass: on the way out, however it went, publishes what the metadata store
    holds then (tasks' writes included) into the remote store, for readers with only its
    credentials (`storage.metadata.bucket`); tells `failed` why that failed, if it did.
    The next pass publishes whatever this one could not. With it go the tiered topics'
    partition counts `topic_partitions` reads from the cluster (a read replica's topic
    needs partitions not tiered yet too); when they cannot be read, those published last stay."""
    try:
        yield
    finally:
        if not skip:
            counts = None
            if topic_partitions is not None:
                try:
                    counts = await topic_partitions()
                except Exception as e:  # noqa: BLE001 - the counts published last stay; the metadata still goes
                    log_failure(log, logging.WARNING, "reading the tiered topics' partition counts to publish", e)
            try:
                await rlmm.refresh()
                published = await publish(rsm, rlmm.partition_states(), topic_partitions=counts)
                log.info("remote log metadata generation %d published: %d partition(s) changed%s",
                         published.generation, published.partitions_changed,
                         ", a new snapshot" if published.compacted else "")
            except Exception as e:  # noqa: BLE001 - told as the pass's failure, never hiding the pass's own
                failed(log_failure(log, logging.ERROR, "publishing the remote log metadata into the remote store", e))
