"""Puts a partition's log from the real broker into the remote tier, without the pipeline.

For tests of what reads the remote tier: fetch the raw log (Fetch v12, READ_UNCOMMITTED,
so control batches and aborted data come too), cut it into segments on batch
boundaries, build every index with `storage.indexes`, copy with the
RemoteStorageManager and commit the metadata (COPY_SEGMENT_STARTED, then FINISHED).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tierproxy.protocol.apis import ErrorCode, OffsetSpec
from tierproxy.protocol.records import iter_batches
from tierproxy.protocol.requests import fetch_request, list_offsets_request, metadata_request
from tierproxy.client.connection import KafkaConnection
from tierproxy.config.addresses import parse_host_port
from tierproxy.storage.indexes import build_segment_indexes, segment_file_name, write_indexes
from tierproxy.storage.indexes.producer_snapshot import ProducerState
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.model import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tierproxy.storage.rsm import RemoteStorageManager

FETCH_MAX_BYTES = 1 << 20


async def topic_id_of(conn: KafkaConnection, topic: str) -> uuid.UUID:
    response = await conn.request(metadata_request([topic]))
    (described,) = response.topics
    if described.error_code != ErrorCode.none:
        raise RuntimeError(f"Metadata of {topic}: error {described.error_code}")
    return described.topic_id


async def latest_offset(conn: KafkaConnection, topic: str, partition: int) -> int:
    """The log end offset (ListOffsets LATEST, READ_UNCOMMITTED)."""
    response = await conn.request(list_offsets_request({topic: [partition]}, OffsetSpec.LATEST))
    (answer,) = response.topics[0].partitions
    if answer.error_code != ErrorCode.none:
        raise RuntimeError(f"ListOffsets of {topic}-{partition}: error {answer.error_code}")
    return answer.offset


async def fetch_raw_log(conn: KafkaConnection, topic: str, partition: int, start: int = 0,
                        end: int | None = None) -> bytes:
    """The partition's record batches from `start` to `end` (default: the log end), byte for byte."""
    if end is None:
        end = await latest_offset(conn, topic, partition)
    log = bytearray()
    offset = start
    while offset < end:
        response = await conn.request(fetch_request(topic, partition, offset, FETCH_MAX_BYTES))
        (answer,) = response.responses[0].partitions
        if answer.error_code != ErrorCode.none:
            raise RuntimeError(f"Fetch of {topic}-{partition} at {offset}: error {answer.error_code}")
        records = answer.records or b""
        whole = [h for h in iter_batches(records) if h.base_offset < end]
        if not whole:
            raise RuntimeError(f"Fetch of {topic}-{partition} at {offset} returned no whole batch")
        log += records[whole[0].position:whole[-1].end_position]
        offset = whole[-1].next_offset
    return bytes(log)


def cut_segments(log: bytes, *, segment_bytes: int | None = None, cut_offsets: Iterable[int] = ()) -> list[bytes]:
    """The log in pieces on batch boundaries: a new piece starts at the first batch holding or
    after each of `cut_offsets`, and when the current one would exceed `segment_bytes`."""
    cuts = sorted(cut_offsets)
    pieces: list[bytes] = []
    start = 0
    for header in iter_batches(log):
        size = header.end_position - start
        crossed = bool(cuts) and header.last_offset >= cuts[0]
        while cuts and header.last_offset >= cuts[0]:
            cuts.pop(0)
        if header.position > start and (crossed or (segment_bytes is not None and size > segment_bytes)):
            pieces.append(log[start:header.position])
            start = header.position
    if start < len(log):
        pieces.append(log[start:])
    return pieces


async def tier_log(
    log: bytes,
    topic_id_partition: TopicIdPartition,
    *,
    rsm: RemoteStorageManager,
    rlmm: RemoteLogMetadataManager,
    work_dir: Path,
    segment_bytes: int | None = None,
    cut_offsets: Iterable[int] = (),
) -> list[RemoteLogSegmentMetadata]:
    """Copy the log's segments and commit them FINISHED; returns their metadata, oldest first."""
    directory = Path(work_dir) / str(topic_id_partition)
    directory.mkdir(parents=True, exist_ok=True)
    state = ProducerState()
    epochs: tuple = ()
    tiered = []
    for piece in cut_segments(log, segment_bytes=segment_bytes, cut_offsets=cut_offsets):
        base_offset = next(iter_batches(piece)).base_offset
        log_path = directory / segment_file_name(base_offset, ".log")
        log_path.write_bytes(piece)
        indexes = build_segment_indexes(log_path, base_offset, initial_producer_state=state,
                                        initial_leader_epochs=epochs)
        state, epochs = indexes.producer_state, indexes.leader_epochs
        segment_data = write_indexes(indexes, log_path, directory, overwrite=True)
        metadata = RemoteLogSegmentMetadata(
            segment_id=RemoteLogSegmentId.generate(topic_id_partition),
            start_offset=indexes.base_offset,
            end_offset=indexes.end_offset,
            max_timestamp_ms=indexes.max_timestamp_ms,
            leader_epoch=max(indexes.last_leader_epoch, 0),
            event_timestamp_ms=_now_ms(),
            segment_leader_epochs=indexes.segment_leader_epochs,
            segment_size_in_bytes=indexes.size_in_bytes,
            txn_index_empty=indexes.txn_index_empty,
        )
        await rlmm.add_remote_log_segment_metadata(metadata)
        await rsm.copy_log_segment_data(metadata, segment_data)
        finished = RemoteLogSegmentMetadataUpdate(
            metadata.segment_id, _now_ms(), RemoteLogSegmentState.COPY_SEGMENT_FINISHED, metadata.leader_epoch
        )
        await rlmm.update_remote_log_segment_metadata(finished)
        tiered.append(metadata.with_update(finished))
    return tiered


async def tier_raw_log(
    conn: KafkaConnection,
    topic: str,
    partition: int,
    *,
    rsm: RemoteStorageManager,
    rlmm: RemoteLogMetadataManager,
    work_dir: Path,
    segment_bytes: int | None = None,
    cut_offsets: Iterable[int] = (),
    end: int | None = None,
) -> list[RemoteLogSegmentMetadata]:
    """Fetch the partition's log below `end` (default: all of it) from the broker and tier it (see `tier_log`)."""
    tip = TopicIdPartition(await topic_id_of(conn, topic), topic, partition)
    log = await fetch_raw_log(conn, topic, partition, 0, end)
    return await tier_log(log, tip, rsm=rsm, rlmm=rlmm, work_dir=work_dir, segment_bytes=segment_bytes,
                          cut_offsets=cut_offsets)


async def tier_from_broker(
    bootstrap_servers: str, topic: str, partition: int, **options: Any
) -> list[RemoteLogSegmentMetadata]:
    """`tier_raw_log` on a connection to the first of `bootstrap_servers`."""
    first = bootstrap_servers.split(",")[0]
    async with await KafkaConnection.open(*parse_host_port(first)) as conn:
        return await tier_raw_log(conn, topic, partition, **options)


def _now_ms() -> int:
    return int(time.time() * 1000)
