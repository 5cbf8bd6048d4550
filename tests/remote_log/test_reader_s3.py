"""The remote read path against the S3 backend on moto's real S3 server over HTTP, and an outage.

The module runs its own S3 server: stopping it must not disturb the shared one, and
moto forgets every object when it restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tierproxy.remote_log.metrics import RemoteMetrics
from tierproxy.remote_log.reader import IsolationLevel
from tierproxy.storage.errors import RemoteStorageError
from tierproxy.storage.manifest import BLOCK_BYTES
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tierproxy.storage.s3 import S3RemoteStorageManager
from testbed.s3 import S3Server
from tests.helpers.remote_log import build_partition, check, close, make_reader

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def own_s3() -> Iterator[S3Server]:
    server = S3Server(bucket="remote-read")
    server.start()
    try:
        yield server
    finally:
        server.close()


@contextlib.asynccontextmanager
async def s3_remote_log(
    server: S3Server, directory: Path
) -> AsyncIterator[tuple[S3RemoteStorageManager, FileRemoteLogMetadataManager]]:
    rsm = S3RemoteStorageManager(
        server.bucket,
        prefix=directory.name,
        endpoint_url=server.endpoint_url,
        region=server.region,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
        # An outage must surface fast: two attempts, tiny backoffs.
        max_attempts=2,
        retry_backoff_ms=10,
        retry_backoff_max_ms=20,
        request_timeout_ms=3000,
    )
    async with rsm, FileRemoteLogMetadataManager(directory / "metadata") as rlmm:
        yield rsm, rlmm


async def test_reads_from_s3_return_the_right_batches(own_s3: S3Server, tmp_path: Path) -> None:
    async with s3_remote_log(own_s3, tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=2, batches_per_segment=15)
        reader = make_reader(rsm, rlmm, chunk_size=700)
        for offset in range(partition.log_start_offset, partition.log_end_offset + 1, 3):
            for max_bytes, min_one in ((1 << 20, True), (500, False)):
                result = await reader.read(partition.tp, offset, max_bytes, min_one_batch=min_one)
                check(result, partition, offset, max_bytes, min_one)
        committed = await reader.read(partition.tp, partition.log_start_offset, 1 << 20, min_one_batch=True,
                                      isolation_level=IsolationLevel.READ_COMMITTED)
        assert committed.aborted_transactions == [] and committed.records_size > 0
        target = partition.batches[20]
        found = await reader.offset_for_timestamp(partition.tp, 1_700_000_000_000 + 10 * target.base_offset)
        assert found.offset == target.base_offset
        await close(reader)


async def test_an_outage_is_a_retriable_error_and_reads_resume_after_it(own_s3: S3Server, tmp_path: Path) -> None:
    async with s3_remote_log(own_s3, tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=2, batches_per_segment=15)
        metrics = RemoteMetrics()
        reader = make_reader(rsm, rlmm, chunk_size=700, metrics=metrics)
        first = partition.segments[0].start_offset
        check(await reader.read(partition.tp, first, 600, min_one_batch=True), partition, first, 600, True)

        cold = partition.segments[1].start_offset  # nothing of this segment is cached yet
        own_s3.stop()
        try:
            with pytest.raises(RemoteStorageError) as raised:
                await asyncio.wait_for(reader.read(partition.tp, cold, 600, min_one_batch=True), 20)
            assert raised.value.retriable
            assert metrics.value("tierproxy_remote_read_errors_total",
                                 {"topic": partition.tp.topic, "reason": "store_unavailable"}) == 1
            # What the caches held before the outage is still served.
            check(await reader.read(partition.tp, first, 600, min_one_batch=True), partition, first, 600, True)
        finally:
            own_s3.start(create_bucket=True)
        # moto came back empty: the segments are copied again, as the pipeline would.
        for segment, data in zip(partition.segments, partition.segment_data):
            await rsm.copy_log_segment_data(segment, data)
        result = await reader.read(partition.tp, cold, 600, min_one_batch=True)
        check(result, partition, cold, 600, True)
        await close(reader)


async def test_a_sequential_read_reads_runs_of_chunks_with_one_get_each(own_s3: S3Server, tmp_path: Path) -> None:
    async with s3_remote_log(own_s3, tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=2, batches_per_segment=40,
                                          value_size=30_000)
        chunk = BLOCK_BYTES  # runs need chunks of whole checksum blocks
        chunks = sum(-(-segment.segment_size_in_bytes // chunk) for segment in partition.segments)
        reader = make_reader(rsm, rlmm, chunk_size=chunk, chunk_cache_bytes=32 * chunk)
        gets: list[str] = []

        def observe(operation: str, seconds: float, ok: bool) -> None:
            if operation == "get_range":
                gets.append(operation)

        rsm.observe_requests(observe)
        offset = partition.log_start_offset
        while offset <= partition.log_end_offset:
            result = await reader.read(partition.tp, offset, chunk, min_one_batch=True)
            check(result, partition, offset, chunk, True)
            assert result.next_fetch_offset > offset
            offset = result.next_fetch_offset
        await close(reader)
    assert chunks >= 8
    # A chunk on demand at the start of each segment, the rest in runs of up to four.
    assert len(gets) <= chunks // 2
