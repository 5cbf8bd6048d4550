"""Puts a partition's log from the real broker into the remote tier, without the pipeline.

For tests of what reads the remote tier: fetch the raw log (Fetch v12, READ_UNCOMMITTED,
so control batches and aborted data come too), cut it into segments on batch
boundaries and copy each with `storage.segment_copy` (indexes, COPY_SEGMENT_STARTED,
the copy), then commit it COPY_SEGMENT_FINISHED.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from tierproxy.protocol.apis import ErrorCode, OffsetSpec
from tierproxy.protocol.records import iter_batches
from tierproxy.protocol.requests import fetch_request, list_offsets_request, metadata_request
from tierproxy.client.connection import KafkaConnection
from tierproxy.config.addresses import parse_host_port
from tierproxy.storage.indexes import segment_file_name
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.model import RemoteLogSegmentMetadata, TopicIdPartition
from tierproxy.storage.rsm import RemoteStorageManager
from tierproxy.storage.segment_copy import copy_segment, finish_segment_copy

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


async def read_log(fetch: Callable[[int], Awaitable[Any]], what: str, start: int, end: int) -> bytes:
    """Whole record batches from the one holding `start` to the last one below `end`, byte
    for byte. `fetch(offset)` is a Fetch of `what` at `offset`: the kio partition answer."""
    log = bytearray()
    offset = start
    while offset < end:
        answer = await fetch(offset)
        if answer.error_code != ErrorCode.none:
            raise RuntimeError(f"Fetch of {what} at {offset}: error {answer.error_code}")
        records = answer.records or b""
        whole = [h for h in iter_batches(records) if h.base_offset < end]
        if not whole:
            raise RuntimeError(f"Fetch of {what} at {offset} returned no whole batch")
        log += records[whole[0].position:whole[-1].end_position]
        offset = whole[-1].next_offset
    return bytes(log)


async def fetch_raw_log(conn: KafkaConnection, topic: str, partition: int, start: int = 0,
                        end: int | None = None) -> bytes:
    """The partition's record batches from `start` to `end` (default: the log end), byte for byte."""
    if end is None:
        end = await latest_offset(conn, topic, partition)

    async def fetch(offset: int) -> Any:
        response = await conn.request(fetch_request(topic, partition, offset, FETCH_MAX_BYTES))
        (answer,) = response.responses[0].partitions
        return answer

    return await read_log(fetch, f"{topic}-{partition}", start, end)


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
    state, epochs = None, ()
    tiered = []
    for piece in cut_segments(log, segment_bytes=segment_bytes, cut_offsets=cut_offsets):
        base_offset = next(iter_batches(piece)).base_offset
        log_path = directory / segment_file_name(base_offset, ".log")
        log_path.write_bytes(piece)
        copied = await copy_segment(rsm, rlmm, topic_id_partition, log_path, base_offset, directory,
                                    producer_state=state, leader_epochs=epochs)
        state, epochs = copied.indexes.producer_state, copied.indexes.leader_epochs
        tiered.append(await finish_segment_copy(rlmm, copied.metadata))
    return tiered


async def tier_raw_log(conn: KafkaConnection, topic: str, partition: int, *, end: int | None = None,
                       **options: Any) -> list[RemoteLogSegmentMetadata]:
    """Fetch the partition's log below `end` (default: all of it) from the broker and tier it
    (`tier_log`, with `options`: rsm, rlmm, work_dir, ...)."""
    tip = TopicIdPartition(await topic_id_of(conn, topic), topic, partition)
    return await tier_log(await fetch_raw_log(conn, topic, partition, 0, end), tip, **options)


async def tier_from_broker(
    bootstrap_servers: str, topic: str, partition: int, **options: Any
) -> list[RemoteLogSegmentMetadata]:
    """`tier_raw_log` on a connection to the first of `bootstrap_servers`."""
    first = bootstrap_servers.split(",")[0]
    async with await KafkaConnection.open(*parse_host_port(first)) as conn:
        return await tier_raw_log(conn, topic, partition, **options)

