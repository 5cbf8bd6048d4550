"""The copy task: one partition's planned range, from the leader to remote segments.

Runs inside a Spark task (any executor), or directly. It reads raw record batches with
Fetch (READ_UNCOMMITTED: aborted data and transaction markers included) from the range
start, writes whole batches byte for byte to a local `.log`, and cuts a segment before a
batch that would take it past `segment.bytes` or whose timestamp is more than `segment.ms`
after the segment's first batch (Kafka's roll rules). The last, partial segment is shipped
only if its first batch is older than `segment.ms`; otherwise it waits for more data, as
the broker's active segment would. A batch at or past the range end (the last stable
offset, always a batch boundary) is never included.

For each cut segment, `storage.segment_copy.copy_segment`: build every index (the producer
state and leader epochs chained from the previous segment), add the metadata as
COPY_SEGMENT_STARTED under a fresh segment id for this attempt, upload. The task never marks a segment FINISHED: it returns the
metadata of what it uploaded, and the driver commits exactly one attempt's segments per
range (`pipeline.commit`). A failed or duplicate attempt leaves STARTED segments the
driver cleans up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierproxy.protocol.apis import ErrorCode, error_name
from tierproxy.protocol.records import read_batch_header
from tierproxy.config import (
    Config,
    parse,
    LOG_INDEX_INTERVAL_BYTES,
    PIPELINE_FETCH_MAX_BYTES,
    PIPELINE_TEST_FAIL_AFTER_OBJECTS,
    REMOTE_LOG_METADATA_BACKEND,
)
from tierproxy.storage.factory import remote_log_metadata_manager, remote_storage_manager
from tierproxy.storage.indexes import EpochEntry, LeaderEpochCheckpoint, ProducerState, segment_file_name
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.metadata.serde import deserialize, serialize
from tierproxy.storage.errors import RemoteStorageError
from tierproxy.storage.model import IndexType, RemoteLogSegmentMetadata, TopicIdPartition
from tierproxy.storage.quota import RateQuota
from tierproxy.storage.rsm import RemoteStorageManager
from tierproxy.storage.segment_copy import copy_segment

from tierproxy.client.cluster import Cluster, ClusterError
from .plan import PartitionPlan

log = logging.getLogger(__name__)

_INT32_MAX = 2**31 - 1
_EMPTY_FETCHES_BEFORE_GIVING_UP = 20


class CopyError(RuntimeError):
    """The partition cannot be copied as planned (topic recreated, data gone, ...)."""


class InjectedFailure(RuntimeError):
    """Raised by the `pipeline.test.fail.after.objects` test hook."""


@dataclass(slots=True)
class CopyResult:
    """What one attempt uploaded: segment metadata as serde bytes (picklable, compact)."""

    topic: str
    partition: int
    segments: list[bytes] = field(default_factory=list)
    bytes_copied: int = 0
    pending_bytes: int = 0  # the tail left for a later pass (younger than segment.ms)
    attempt: int = 0
    error: str | None = None  # set when the last allowed attempt failed: nothing to commit

    def metadata(self) -> list[RemoteLogSegmentMetadata]:
        return [deserialize(s) for s in self.segments]  # type: ignore[misc]  # segments holds only these


def metadata_manager(
    config: Config, *, in_task: bool = False, scratch_dir: str | None = None,
    partitions: Iterable[TopicIdPartition] | None = None,
) -> RemoteLogMetadataManager:
    """The pipeline's metadata manager (not started); a task's keeps only its `partitions`.

    File backend: a shared writer (the driver and its tasks append to one file at once, each
    append under the file's flock), so driver and executors must share that file system.
    Topic backend: tasks only write, so they materialize into a scratch directory of their own
    instead of the driver's.
    """
    if config[REMOTE_LOG_METADATA_BACKEND] == "file":
        return remote_log_metadata_manager(config, shared=True, partitions=partitions)
    if in_task:
        if scratch_dir is None:
            raise ValueError("a task's topic-backed metadata manager needs a scratch directory")
        config = config.with_overrides({"remote.log.metadata.dir": scratch_dir})
    return remote_log_metadata_manager(config, partitions=partitions)


class _SegmentWriter:
    """The `.log` of the segment being cut, appended to in whole-batch spans."""

    def __init__(self, directory: Path, base_offset: int, first_timestamp: int) -> None:
        self.base_offset = base_offset
        self.first_timestamp = first_timestamp
        self.path = directory / segment_file_name(base_offset, ".log")
        self.file = open(self.path, "wb", buffering=0)
        self.size = 0

    def write(self, span: memoryview) -> None:
        self.file.write(span)
        self.size += len(span)

    def close(self) -> None:
        self.file.close()


async def copy_partition(
    config: Config,
    plan: PartitionPlan,
    *,
    cluster: Cluster,
    rsm: RemoteStorageManager,
    rlmm: RemoteLogMetadataManager,
    work_dir: Path,
    now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    on_segment: Callable[[RemoteLogSegmentMetadata], None] | None = None,
    quota: RateQuota | None = None,
) -> CopyResult:
    result = CopyResult(plan.topic, plan.partition)
    if plan.empty:
        return result
    tip = plan.topic_id_partition
    topics = await cluster.topics([plan.topic])
    if plan.topic not in topics or topics[plan.topic].topic_id != plan.topic_id:
        raise CopyError(f"{plan.topic} was deleted or recreated since the pass was planned")
    producer_state, leader_epochs = await _initial_state(rsm, plan)
    max_bytes = config[PIPELINE_FETCH_MAX_BYTES]
    index_interval = config[LOG_INDEX_INTERVAL_BYTES]

    uploading: asyncio.Task[None] | None = None

    async def upload(writer: _SegmentWriter) -> None:
        """Indexes (chained from the previous segment's producer state and leader epochs),
        metadata as COPY_SEGMENT_STARTED, the copy; then the local files go."""
        nonlocal producer_state, leader_epochs
        if quota is not None:  # KIP-956: wait while the copy quota is exceeded, as Kafka's copy task does
            await quota.acquire(writer.size)
        try:
            copied = await copy_segment(
                rsm, rlmm, tip, writer.path, writer.base_offset, work_dir,
                producer_state=producer_state, leader_epochs=leader_epochs, index_interval_bytes=index_interval,
                leader_epoch=plan.leader_epoch, event_timestamp_ms=now_ms(),
            )
        except RemoteStorageError as e:
            # Named as the upload it is: its first store call may be a delete (of a retried
            # copy's stale objects), which would otherwise read like a cleanup.
            raise RemoteStorageError(f"upload of the segment at offset {writer.base_offset} of {tip}: {e}",
                                     retriable=e.retriable) from e
        producer_state, leader_epochs = copied.indexes.producer_state, copied.indexes.leader_epochs
        result.segments.append(serialize(copied.metadata))  # the task fails as a whole if a copy does
        data = copied.data
        for path in (data.log_segment, data.offset_index, data.time_index, data.transaction_index,
                     data.producer_snapshot_index):
            if path is not None:
                path.unlink(missing_ok=True)
        result.bytes_copied += copied.metadata.segment_size_in_bytes
        if on_segment is not None:
            on_segment(copied.metadata)

    async def ship(writer: _SegmentWriter) -> None:
        """Copy in the background while the next segment is fetched; one copy at a time, so
        that each segment's indexes start from the state the previous one ended with."""
        nonlocal uploading
        writer.close()
        if uploading is not None:
            await uploading
        uploading = asyncio.create_task(upload(writer))

    writer: _SegmentWriter | None = None
    offset = plan.start_offset
    empty_fetches = 0
    try:
        while offset < plan.end_offset:
            fetched_from = offset
            response = await cluster.fetch_raw(topics, plan.topic, plan.partition, offset, max_bytes)
            if response.error_code != ErrorCode.none:
                raise ClusterError(
                    f"Fetch {plan.topic}-{plan.partition} at {offset}: {error_name(response.error_code)}",
                    response.error_code,
                )
            records = memoryview(response.records or b"")
            position = span_start = 0
            stop = False
            while (header := read_batch_header(records, position)) is not None:
                if header.last_offset < offset:  # a fetch from inside a batch returns all of it
                    position = span_start = header.end_position
                    continue
                if header.last_offset >= plan.end_offset:
                    stop = True  # at the last stable offset (or a batch across it: never copied)
                    break
                if writer is not None and (
                    writer.size + (position - span_start) + header.size > plan.segment_bytes
                    or header.max_timestamp - writer.first_timestamp > plan.segment_ms
                    or header.last_offset - writer.base_offset > _INT32_MAX
                ):
                    writer.write(records[span_start:position])
                    await ship(writer)
                    writer, span_start = None, position
                if writer is None:
                    writer = _SegmentWriter(work_dir, header.base_offset, header.max_timestamp)
                offset = header.next_offset
                position = header.end_position
            if writer is not None and position > span_start:
                writer.write(records[span_start:position])
            if stop:
                break
            if offset == fetched_from:  # no whole batch past the fetch offset came back
                empty_fetches += 1
                if empty_fetches >= _EMPTY_FETCHES_BEFORE_GIVING_UP:
                    raise CopyError(f"{plan.topic}-{plan.partition}: no data at offset {offset}, "
                                    f"below the last stable offset {plan.end_offset}")
                await asyncio.sleep(0.05)
            else:
                empty_fetches = 0
        if writer is not None:
            if writer.size and now_ms() - writer.first_timestamp >= plan.segment_ms:
                await ship(writer)
            else:
                result.pending_bytes = writer.size
                writer.close()
            writer = None
        if uploading is not None:
            await uploading
    finally:
        if writer is not None:
            writer.close()
        if uploading is not None and not uploading.done():
            uploading.cancel()
            with contextlib.suppress(BaseException):
                await uploading
    return result


async def _initial_state(rsm: RemoteStorageManager, plan: PartitionPlan) -> tuple[ProducerState, tuple[EpochEntry, ...]]:
    """Producer state and leader epochs at the range start: those the previous remote segment
    shipped, or empty for a partition's first segment (or after a gap)."""
    if plan.previous_segment is None:
        return ProducerState(), ()
    previous = deserialize(plan.previous_segment)
    assert isinstance(previous, RemoteLogSegmentMetadata)
    snapshot = await rsm.fetch_index(previous, IndexType.PRODUCER_SNAPSHOT)
    checkpoint = await rsm.fetch_index(previous, IndexType.LEADER_EPOCH)
    return ProducerState.from_snapshot(snapshot), tuple(LeaderEpochCheckpoint.parse(checkpoint).entries)


def _inject_failure(rsm: RemoteStorageManager, after_objects: int) -> None:
    """Test hook: every object upload after the first `after_objects` raises. Wraps the
    object store's put primitives on this instance only."""
    uploaded = 0
    for name in ("_put_file", "_put_bytes"):
        original = getattr(rsm, name)

        async def put(*args: Any, _original: Any = original) -> Any:
            nonlocal uploaded
            if uploaded >= after_objects:
                raise InjectedFailure(f"pipeline.test.fail.after.objects={after_objects}: failing this upload")
            uploaded += 1
            return await _original(*args)

        setattr(rsm, name, put)


async def run_copy(config: Config, plan: PartitionPlan, *, attempt: int = 0,
                   quota: RateQuota | None = None) -> CopyResult:
    """One attempt at one partition: opens its own connections, storage and metadata manager."""
    scratch = Path(tempfile.mkdtemp(prefix=f"tierproxy-copy-{plan.topic}-{plan.partition}-"))
    try:
        rsm = remote_storage_manager(config)
        fail_after = config[PIPELINE_TEST_FAIL_AFTER_OBJECTS]
        if fail_after and attempt == 0:
            _inject_failure(rsm, fail_after)
        async with Cluster.from_config(config) as cluster, rsm, \
                metadata_manager(config, in_task=True, scratch_dir=str(scratch / "metadata"),
                                 partitions=[plan.topic_id_partition]) as rlmm:
            result = await copy_partition(config, plan, cluster=cluster, rsm=rsm, rlmm=rlmm, work_dir=scratch,
                                          quota=quota)
        result.attempt = attempt
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def copy_task(raw_config: dict[str, str], plan: PartitionPlan, quota: RateQuota | None = None) -> CopyResult:
    """The body of a Spark task: `raw_config` is `Config.raw()`, shipped from the driver."""
    attempt = 0
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None:
            attempt = context.attemptNumber()
    except ImportError:  # called outside Spark
        pass
    config = parse(raw_config, source="<shipped from the driver>")
    return asyncio.run(run_copy(config, plan, attempt=attempt, quota=quota))
