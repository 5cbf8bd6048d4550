"""Bulk bodies of S3 reads on threads (storage/s3_bodies.py), over HTTP on moto's server: read
from the socket into the caller's buffers on kept-alive connections, a connection cut in the
middle of a body, a slow body, a read cancelled while its thread writes."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from tierproxy.storage.errors import RemoteResourceNotFound, RemoteStorageError
from tierproxy.storage.model import IndexType
from tierproxy.storage.s3 import MIB
from tierproxy.storage.s3_bodies import Endpoint
from testbed.s3 import S3Server

from tests.helpers.s3 import assert_cut_body_fails_only_what_it_did_not_fill, manager, read_run, relayed_copy

from .rsm_contract import make_segment


def test_the_endpoint_is_what_botocore_resolved_for_an_object():
    path_style = Endpoint.of_url("http://127.0.0.1:9000/bucket/k?X-Amz-Signature=x", "k", "us-east-1")
    assert (path_style.scheme, path_style.netloc, path_style.path_prefix) == ("http", "127.0.0.1:9000", "/bucket/")
    hosted = Endpoint.of_url("https://bucket.s3.eu-west-1.amazonaws.com/k?X-Amz-Date=1", "k", "eu-west-1")
    assert (hosted.host, hosted.port, hosted.netloc, hosted.path_prefix) == (
        "bucket.s3.eu-west-1.amazonaws.com", 443, "bucket.s3.eu-west-1.amazonaws.com", "/")
    with pytest.raises(ValueError):
        Endpoint.of_url("https://bucket.s3.amazonaws.com/other", "k", "us-east-1")


async def test_a_run_goes_from_the_socket_into_its_buffers_over_http(
        s3_server: S3Server, tmp_path: Path) -> None:
    """No ranged GetObject goes through aiobotocore: the bodies are read into the run's own
    buffers. moto's server closes every connection after its response (`Connection: close`):
    none is kept (test_rsm_s3proxy checks the reuse on a server that keeps them alive)."""
    segment = make_segment(tmp_path, log_size=3 * MIB + 5000)
    async with manager(s3_server) as rsm:
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        client = await rsm._s3()
        ranged: list[str] = []
        get_object = client.get_object

        async def counted(**kwargs: object) -> object:
            if "Range" in kwargs:
                ranged.append(str(kwargs["Range"]))
            return await get_object(**kwargs)

        client.get_object = counted
        filled, error = await read_run(rsm, segment.metadata, 0, [MIB, MIB, MIB])
        assert error is None and filled == [segment.log[:MIB], segment.log[MIB:2 * MIB], segment.log[2 * MIB:3 * MIB]]
        assert rsm._bodies is not None and rsm._bodies.endpoint.scheme == "http"
        filled, error = await read_run(rsm, segment.metadata, MIB, [MIB, MIB + 5000])
        assert error is None and b"".join(filled) == segment.log[MIB:]
        assert rsm._bodies._idle == []
        assert ranged == []


async def test_a_connection_cut_mid_body_fails_only_the_buffers_it_did_not_fill(
        s3_server: S3Server, tmp_path: Path) -> None:
    await assert_cut_body_fails_only_what_it_did_not_fill(s3_server, make_segment(tmp_path, log_size=3 * MIB))


async def test_a_slow_body_is_read_whole_while_the_event_loop_runs(s3_server: S3Server, tmp_path: Path) -> None:
    """A body that comes 64 KiB at a time is read on its thread: the event loop goes on
    running meanwhile, and the buffer ends up with the right bytes."""
    segment = make_segment(tmp_path, log_size=2 * MIB)
    async with relayed_copy(s3_server, segment, pace=(64 << 10, 0.01)) as (_, relayed):
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        ticker = asyncio.create_task(tick())
        buffer = memoryview(bytearray(2 * MIB))
        await relayed.read_log_into(segment.metadata, 0, buffer)
        ticker.cancel()
    assert bytes(buffer) == segment.log
    assert ticks >= 5


async def test_a_body_slower_than_the_request_timeout_fails_retriably(s3_server: S3Server, tmp_path: Path) -> None:
    segment = make_segment(tmp_path, log_size=2 * MIB)
    async with relayed_copy(s3_server, segment, pace=(256 << 10, 2.0), request_timeout_ms=300) as (_, relayed):
        with pytest.raises(RemoteStorageError, match="timed out") as e:
            await relayed.read_log_into(segment.metadata, 0, memoryview(bytearray(2 * MIB)))
    assert e.value.retriable


async def test_a_read_cancelled_mid_body_stops_writing_into_the_buffer_before_it_returns(
        s3_server: S3Server, tmp_path: Path) -> None:
    """The buffer is the caller's again once the cancelled read returns: the thread that
    read into it has stopped, and nothing changes it afterwards."""
    segment = make_segment(tmp_path, log_size=4 * MIB)
    async with relayed_copy(s3_server, segment, pace=(64 << 10, 0.02)) as (_, relayed):
        buffer = memoryview(bytearray(4 * MIB))
        read = asyncio.create_task(relayed.read_log_into(segment.metadata, 0, buffer))
        while not any(buffer[:64 << 10]):
            await asyncio.sleep(0.01)
        read.cancel()
        with pytest.raises(asyncio.CancelledError):
            await read
        seen = bytes(buffer)
        await asyncio.sleep(0.3)
        assert bytes(buffer) == seen
        assert seen != segment.log  # it was cut in the middle
        assert relayed._bodies is not None and relayed._bodies._idle == []


async def test_chunks_that_are_not_whole_blocks_say_why_they_are_not_read_in_runs(
        s3_server: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Chunks of 1,000,000 bytes cut checksum blocks (256 KiB) in two: each is read with a GET
    of its own, correctly, and the log says why (once), naming the size that reads runs."""
    segment = make_segment(tmp_path, log_size=3 * MIB)
    async with manager(s3_server) as rsm:
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        seen: list[str] = []
        rsm.observe_requests(lambda operation, seconds, ok: seen.append(operation))
        with caplog.at_level(logging.WARNING, logger="tierproxy.storage.rsm"):
            for start in (0, 2_000_000):
                filled, error = await read_run(rsm, segment.metadata, start, [500_000, 500_000])
                assert error is None and b"".join(filled) == segment.log[start:start + 1_000_000]
    assert seen == ["get_range"] * 4
    (warning,) = [r.getMessage() for r in caplog.records if "not in runs" in r.getMessage()]
    assert "chunks of 500000 bytes are not whole checksum blocks of 262144 bytes" in warning
    assert "multiple of 262144" in warning


async def test_a_cold_segments_manifest_and_indexes_are_read_on_the_threads_too(
        s3_server: S3Server, tmp_path: Path) -> None:
    """No GetObject of a cold segment goes through aiobotocore: manifest, indexes and bodies
    are signed and read on the threads; a missing object is still not found."""
    segment = make_segment(tmp_path, log_size=MIB)
    async with manager(s3_server) as rsm:
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        rsm._forget(segment.metadata)
        client = await rsm._s3()
        calls: list[object] = []
        get_object = client.get_object

        async def counted(**kwargs: object) -> object:
            calls.append(kwargs)
            return await get_object(**kwargs)

        client.get_object = counted
        for index_type in (IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.TRANSACTION):
            assert await rsm.fetch_index(segment.metadata, index_type) == segment.indexes[index_type]
        buffer = memoryview(bytearray(MIB))
        await rsm.read_log_into(segment.metadata, 0, buffer)
        assert bytes(buffer) == segment.log
        with pytest.raises(RemoteResourceNotFound):
            await rsm.get_object("not-there")
        assert calls == []
