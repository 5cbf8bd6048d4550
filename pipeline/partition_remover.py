"""Partition removal: the remote data of topics deleted from the cluster.

Kafka's controller marks the partitions of a deleted topic DELETE_PARTITION_MARKED and its
remote partition remover deletes their data. Here nothing tells us of a deletion, so a
partition is removed when its topic id has remote log metadata but no topic of the cluster
has that id any more (a topic recreated under the same name has a new id, so the old data
goes and the new topic's stays). Before acting, the topic is also looked up by name: a
topic this client may not describe is left out of a listing of all topics, but asked for by
name it gives an authorization error, and nothing is removed.

A removal: DELETE_PARTITION_MARKED -> DELETE_PARTITION_STARTED -> every segment to
DELETE_SEGMENT_STARTED -> every object of the partition deleted (orphans of failed copies
included) -> the segments to DELETE_SEGMENT_FINISHED -> DELETE_PARTITION_FINISHED. Each step
may be repeated, so an interrupted removal completes on a later run.

It runs at most every `remote.partition.remover.task.interval.ms`; the time of the last run
is kept in `<remote.log.metadata.dir>/partition_remover.state`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from tierproxy.config import Config, REMOTE_LOG_METADATA_DIR, REMOTE_PARTITION_REMOVER_TASK_INTERVAL_MS
from tierproxy.storage.files import write_atomically
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.model import (
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tierproxy.storage.rsm import RemoteStorageManager

from tierproxy.client.cluster import Cluster
from .failures import log_failure, one_line
from .local_retention import METADATA_READY_TIMEOUT_S
from .remote_retention import wall_clock_ms

log = logging.getLogger(__name__)

STATE_FILE_NAME = "partition_remover.state"

_MARKED = RemotePartitionDeleteState.DELETE_PARTITION_MARKED
_STARTED = RemotePartitionDeleteState.DELETE_PARTITION_STARTED
_FINISHED = RemotePartitionDeleteState.DELETE_PARTITION_FINISHED


@dataclass(frozen=True, slots=True)
class PartitionRemoval:
    topic_id_partition: TopicIdPartition
    segments: int  # segments whose metadata went to DELETE_SEGMENT_FINISHED
    objects: int  # objects deleted from remote storage


@dataclass(slots=True)
class PartitionRemoverResult:
    ran: bool  # False when the interval since the last run has not passed
    removed: list[PartitionRemoval]
    failures: list[tuple[str, str]]  # (partition or topic, error)


def last_run_ms(state_path: Path) -> int | None:
    try:
        return int(json.loads(state_path.read_text())["last_run_ms"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        log.warning("ignoring unreadable %s: %s", state_path, e)
        return None


def record_run(state_path: Path, now_ms: int) -> None:
    state_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(state_path, (json.dumps({"last_run_ms": now_ms}) + "\n").encode())


async def remove_deleted_partitions(
    config: Config,
    cluster: Cluster,
    rlmm: RemoteLogMetadataManager,
    rsm: RemoteStorageManager,
    *,
    now_ms: int,
    force: bool = False,
) -> PartitionRemoverResult:
    """Remove the remote data of every partition whose topic is gone from the cluster, if
    `remote.partition.remover.task.interval.ms` passed since the last run (or `force`)."""
    state_path = Path(config[REMOTE_LOG_METADATA_DIR]) / STATE_FILE_NAME
    last = last_run_ms(state_path)
    if not force and last is not None and now_ms - last < config[REMOTE_PARTITION_REMOVER_TASK_INTERVAL_MS]:
        return PartitionRemoverResult(False, [], [])
    result = PartitionRemoverResult(True, [], [])

    live_ids = {info.topic_id for info in (await cluster.topics(None)).values()}
    candidates: dict[str, list[TopicIdPartition]] = {}
    for tp in rlmm.partitions():
        if tp.topic_id in live_ids:
            continue
        try:
            await rlmm.wait_until_ready(tp, METADATA_READY_TIMEOUT_S)
            if rlmm.partition_delete_state(tp) == _FINISHED:
                continue
        except Exception as e:
            result.failures.append((str(tp), one_line(e)))
            continue
        candidates.setdefault(tp.topic, []).append(tp)

    async def remove_topic(name: str, tps: list[TopicIdPartition]) -> None:
        try:
            existing = await cluster.topics([name])
        except Exception as e:  # e.g. TOPIC_AUTHORIZATION_FAILED: it may well exist
            log.warning("not removing remote data of topic %s: %s", name, e)
            result.failures.append((name, one_line(e)))
            return
        for tp in sorted(tps, key=lambda t: t.partition):
            if name in existing and existing[name].topic_id == tp.topic_id:
                continue  # created since the listing
            try:
                result.removed.append(await remove_partition(rlmm, rsm, tp))
            except Exception as e:  # one partition's failure must not stop the others
                error = log_failure(log, logging.WARNING, f"removal of remote partition {tp}", e)
                result.failures.append((str(tp), error))

    await asyncio.gather(*(remove_topic(name, tps) for name, tps in candidates.items()))
    result.removed.sort(key=lambda r: (r.topic_id_partition.topic, r.topic_id_partition.partition))
    record_run(state_path, now_ms)
    return result


async def remove_partition(
    rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager, tp: TopicIdPartition
) -> PartitionRemoval:
    """Every remote object and segment of `tp` gone, its delete state FINISHED; resumes where
    an earlier attempt stopped."""
    segments = rlmm.list_segments(tp)
    epoch = max((s.leader_epoch for s in segments), default=0)
    state = rlmm.partition_delete_state(tp)
    if state is None:
        await rlmm.put_partition_delete(RemotePartitionDeleteMetadata(tp, _MARKED, wall_clock_ms(), epoch))
        state = _MARKED
    if state == _MARKED:
        await rlmm.put_partition_delete(RemotePartitionDeleteMetadata(tp, _STARTED, wall_clock_ms(), epoch))

    # No segment may look servable while its objects disappear.
    for segment in segments:
        if segment.state != RemoteLogSegmentState.DELETE_SEGMENT_STARTED:
            await rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
                segment.segment_id, wall_clock_ms(), RemoteLogSegmentState.DELETE_SEGMENT_STARTED, epoch))
    objects = len(await rsm.list_partition_objects(tp))
    await rsm.delete_partition(tp)
    for segment in segments:
        await rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            segment.segment_id, wall_clock_ms(), RemoteLogSegmentState.DELETE_SEGMENT_FINISHED, epoch))
    await rlmm.put_partition_delete(RemotePartitionDeleteMetadata(tp, _FINISHED, wall_clock_ms(), epoch))
    log.info("removed remote partition %s: %d segments, %d objects", tp, len(segments), objects)
    return PartitionRemoval(tp, len(segments), objects)
