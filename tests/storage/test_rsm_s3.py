"""The S3 backend against the contract, on moto's S3 server over HTTP (testbed's `s3_server`)."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import crc32c
import pytest
import pytest_asyncio
from aiobotocore.session import AioSession
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, ReadTimeoutError

import tierproxy.storage.rsm
import tierproxy.storage.s3
from tierproxy.storage.errors import (
    RemoteObjectMismatch,
    RemoteResourceNotFound,
    RemoteSegmentNotFound,
    RemoteStorageError,
)
from tierproxy.storage.manifest import BLOCK_BYTES
from tierproxy.storage.model import IndexType
from tierproxy.storage.rsm import ObjectType, RemoteStorageManager
from tierproxy.storage.s3 import MIB, S3RemoteStorageManager, storage_error
from testbed.ports import LOOPBACK, free_port
from testbed.s3 import S3Server

from tierproxy.storage.encryption import KeyRing

from tests.helpers.s3 import S3Objects, manager

from .rsm_contract import (
    LARGE_SEGMENT_BYTES,
    EncryptedRemoteStorageManagerContract,
    RemoteStorageManagerContract,
    make_segment,
    read_all,
)

class TestS3RemoteStorageManager(S3Objects, RemoteStorageManagerContract):
    @pytest_asyncio.fixture(loop_scope="function")
    async def rsm(self, s3_server: S3Server) -> AsyncIterator[S3RemoteStorageManager]:
        async with self.manager_on(s3_server) as rsm:
            yield rsm


async def test_every_request_to_the_store_is_reported(s3_server: S3Server, tmp_path: Path) -> None:
    seen: list[tuple[str, bool]] = []
    segment = make_segment(tmp_path)
    async with manager(s3_server) as rsm:
        rsm.observe_requests(lambda operation, seconds, ok: seen.append((operation, ok)))
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        copied = len(seen)
        await read_all(rsm, segment.metadata, 0, 99)
    assert copied > 0 and all(ok for _, ok in seen)
    assert len(seen) > copied  # the read reported its own requests too


def _s3_crc32c(data: bytes) -> str:
    """The CRC-32C of `data` as S3 writes it (x-amz-checksum-crc32c)."""
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()


async def test_verify_reads_the_checksum_s3_recorded_at_upload_not_the_object(
    s3_server: S3Server, tmp_path: Path
) -> None:
    small, large = make_segment(tmp_path, log_size=1000), make_segment(tmp_path, log_size=LARGE_SEGMENT_BYTES)
    async with manager(s3_server) as rsm:
        seen: list[str] = []
        rsm.observe_requests(lambda operation, seconds, ok: seen.append(operation))
        for segment in (small, large):  # one PutObject, and a multipart upload
            await rsm.copy_log_segment_data(segment.metadata, segment.data)
            seen.clear()
            manifest = await rsm.verify_segment(segment.metadata, check_crc=True)
            assert sorted(set(seen)) == ["get", "head"]  # the manifest, then a HEAD per object
            assert seen.count("head") == len(manifest.objects)
        # An object replaced by one S3 keeps another CRC-32C for: found by the HEAD alone.
        key = rsm._key(small.metadata, ObjectType.LOG)
        other = bytes(b ^ 1 for b in small.log)
        await asyncio.to_thread(s3_server.client().put_object, Bucket=s3_server.bucket, Key=key, Body=other,
                                ChecksumAlgorithm="CRC32C", ChecksumCRC32C=_s3_crc32c(other))
        seen.clear()
        with pytest.raises(RemoteObjectMismatch, match="recorded by the store") as raised:
            await rsm.verify_segment(small.metadata, check_crc=True)
        assert (raised.value.key, raised.value.reason) == (key, RemoteObjectMismatch.CHECKSUM)
        assert "get_range" not in seen
        # One stored without a CRC-32C (by another tool) is read back.
        await asyncio.to_thread(s3_server.client().put_object, Bucket=s3_server.bucket, Key=key, Body=other)
        with pytest.raises(RemoteObjectMismatch, match="read back"):
            await rsm.verify_segment(small.metadata, check_crc=True)
    head = s3_server.client().head_object(Bucket=s3_server.bucket, Key=rsm._key(large.metadata, ObjectType.LOG),
                                          ChecksumMode="ENABLED")
    assert head["ChecksumCRC32C"] == _s3_crc32c(large.log)


class TestS3RemoteStorageManagerEncrypted(EncryptedRemoteStorageManagerContract, TestS3RemoteStorageManager):
    @pytest_asyncio.fixture(loop_scope="function")
    async def rsm(self, s3_server: S3Server, keys: KeyRing) -> AsyncIterator[S3RemoteStorageManager]:
        async with self.manager_on(s3_server, keys=keys) as rsm:
            yield rsm

    def other_manager(self, rsm: RemoteStorageManager, keys: KeyRing) -> RemoteStorageManager:
        assert isinstance(rsm, S3RemoteStorageManager)
        other = manager(self.server, keys=keys)
        other.prefix = rsm.prefix
        return other


async def test_large_segment_goes_up_in_parts(s3_server: S3Server, tmp_path: Path) -> None:
    segment = make_segment(tmp_path, log_size=LARGE_SEGMENT_BYTES)
    async with manager(s3_server) as rsm:
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        key = rsm._key(segment.metadata, ObjectType.LOG)
        small_key = rsm._key(segment.metadata, ObjectType.OFFSET_INDEX)
    client = s3_server.client()
    # S3 marks a multipart object's ETag with its part count.
    assert client.head_object(Bucket=s3_server.bucket, Key=key)["ETag"].strip('"').endswith("-3")
    assert "-" not in client.head_object(Bucket=s3_server.bucket, Key=small_key)["ETag"]


async def test_failed_multipart_upload_is_aborted(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    segment = make_segment(tmp_path, log_size=LARGE_SEGMENT_BYTES)
    real_take = tierproxy.storage.s3._Parts.take
    parts_read = 0

    def failing_take(parts):  # the local disk fails after the first part
        nonlocal parts_read
        parts_read += 1
        if parts_read == 2:
            raise RemoteStorageError(f"cannot read local file {segment.data.log_segment}: I/O error", retriable=False)
        return real_take(parts)

    monkeypatch.setattr(tierproxy.storage.s3._Parts, "take", failing_take)
    async with manager(s3_server) as rsm:
        with pytest.raises(RemoteStorageError, match="I/O error"):
            await rsm.copy_log_segment_data(segment.metadata, segment.data)
        key = rsm._key(segment.metadata, ObjectType.LOG)
        # The indexes went up beside the failed log, the manifest never did.
        with pytest.raises(RemoteSegmentNotFound, match="incomplete"):
            await rsm.verify_segment(segment.metadata)
        assert await rsm._object_size(key) is None
    uploads = s3_server.client().list_multipart_uploads(Bucket=s3_server.bucket, Prefix=key)
    assert parts_read == 2
    assert uploads.get("Uploads", []) == []


async def test_unreachable_store_fails_retriably_after_the_configured_attempts(
    s3_server: S3Server, tmp_path: Path
) -> None:
    segment = make_segment(tmp_path, log_size=1000)
    dead_endpoint = f"http://{LOOPBACK}:{free_port()}"  # nothing listens there: S3 is down
    async with manager(s3_server, endpoint_url=dead_endpoint, max_attempts=3) as rsm:
        with pytest.raises(RemoteStorageError) as raised:
            await rsm.fetch_index(segment.metadata, IndexType.OFFSET)
    assert raised.value.retriable
    assert type(raised.value) is RemoteStorageError
    assert "attempt 3 of 3" in str(raised.value)
    assert isinstance(raised.value.__cause__, EndpointConnectionError)


async def test_start_makes_the_client_even_with_the_store_down_and_reads_make_none(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client (botocore's models and endpoint rules) is made before serving, not on
    the first read; a store that is down does not stop a start."""
    made = []
    create_client = AioSession.create_client

    def counted(self, *args, **kwargs):
        made.append(args)
        return create_client(self, *args, **kwargs)

    monkeypatch.setattr(AioSession, "create_client", counted)
    segment = make_segment(tmp_path, log_size=1000)
    dead_endpoint = f"http://{LOOPBACK}:{free_port()}"
    async with manager(s3_server, endpoint_url=dead_endpoint, max_attempts=1) as rsm:
        await rsm.start()
        assert len(made) == 1
        with pytest.raises(RemoteStorageError):
            await rsm.fetch_index(segment.metadata, IndexType.OFFSET)
        assert len(made) == 1


class _Relay:
    """A loopback TCP relay to the S3 server that can be switched on later: S3 coming back."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, LOOPBACK, self.port)

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        server_reader, server_writer = await asyncio.open_connection(LOOPBACK, self.target_port)

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except ConnectionError:
                pass
            finally:
                writer.close()

        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def test_retriable_failure_then_recovery_succeeds(s3_server: S3Server, tmp_path: Path) -> None:
    segment = make_segment(tmp_path, log_size=50_000)
    relay = _Relay(s3_server.port)
    async with manager(
        s3_server,
        endpoint_url=f"http://{LOOPBACK}:{relay.port}",
        max_attempts=50,
        retry_backoff_ms=20,
        retry_backoff_max_ms=100,
    ) as rsm:
        copy = asyncio.create_task(rsm.copy_log_segment_data(segment.metadata, segment.data))
        await asyncio.sleep(0.3)  # several attempts fail: connection refused
        assert not copy.done()
        await relay.start()
        try:
            await asyncio.wait_for(copy, timeout=30)
            assert relay.connections > 0
            assert await read_all(rsm, segment.metadata, 0) == segment.log
        finally:
            await rsm.close()
            await relay.stop()


async def test_missing_bucket_is_not_retriable(s3_server: S3Server, tmp_path: Path) -> None:
    segment = make_segment(tmp_path, log_size=1000)
    async with manager(s3_server, bucket=f"missing-{uuid.uuid4().hex[:8]}", max_attempts=5) as rsm:
        with pytest.raises(RemoteStorageError) as raised:
            await rsm.copy_log_segment_data(segment.metadata, segment.data)
    assert not raised.value.retriable
    assert not isinstance(raised.value, RemoteResourceNotFound)
    assert "NoSuchBucket" in str(raised.value)
    assert "attempt 1 of 5" in str(raised.value)


async def test_closed_manager_refuses_calls(s3_server: S3Server, tmp_path: Path) -> None:
    rsm = manager(s3_server)
    await rsm.close()
    with pytest.raises(RemoteStorageError) as raised:
        await rsm.list_partition_objects(make_segment(tmp_path, log_size=10).metadata.topic_id_partition)
    assert not raised.value.retriable


def test_part_size_below_the_s3_minimum_is_rejected() -> None:
    with pytest.raises(ValueError, match="multipart_part_bytes"):
        S3RemoteStorageManager("b", multipart_part_bytes=5 * MIB - 1)


def _client_error(status: int, code: str) -> ClientError:
    response = {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "GetObject")


@pytest.mark.parametrize(
    ("error", "kind", "retriable"),
    [
        (_client_error(404, "NoSuchKey"), RemoteResourceNotFound, False),
        (_client_error(404, "404"), RemoteResourceNotFound, False),
        (_client_error(404, "NoSuchBucket"), RemoteStorageError, False),
        (_client_error(403, "AccessDenied"), RemoteStorageError, False),
        (_client_error(400, "InvalidArgument"), RemoteStorageError, False),
        (_client_error(503, "SlowDown"), RemoteStorageError, True),
        (_client_error(500, "InternalError"), RemoteStorageError, True),
        (_client_error(429, "TooManyRequests"), RemoteStorageError, True),
        (_client_error(400, "RequestTimeout"), RemoteStorageError, True),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), RemoteStorageError, True),
        (ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), RemoteStorageError, True),
        (asyncio.TimeoutError(), RemoteStorageError, True),
        (ConnectionResetError(), RemoteStorageError, True),
        (NoCredentialsError(), RemoteStorageError, False),
    ],
)
def test_error_classification(error: BaseException, kind: type, retriable: bool) -> None:
    mapped = storage_error(error, "get s3://b/k")
    assert type(mapped) is kind
    assert mapped.retriable is retriable
    assert "s3://b/k" in str(mapped)


def test_programming_errors_are_not_disguised() -> None:
    with pytest.raises(KeyError):
        storage_error(KeyError("x"), "get s3://b/k")



@pytest.mark.parametrize("sse, kms_key_id", [("AES256", ""), ("aws:kms", "alias/tierproxy-test"), ("aws:kms", "")])
@pytest.mark.parametrize("log_size", [100_000, LARGE_SEGMENT_BYTES], ids=["small", "multipart"])
async def test_server_side_encryption_of_every_object(
    s3_server: S3Server, tmp_path: Path, sse: str, kms_key_id: str, log_size: int
) -> None:
    segment = make_segment(tmp_path, log_size=log_size)
    async with manager(s3_server, sse=sse, sse_kms_key_id=kms_key_id) as rsm:
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        keys = await rsm.list_partition_objects(segment.metadata.topic_id_partition)
        assert await read_all(rsm, segment.metadata, 0) == segment.log
    assert len(keys) == len(ObjectType)
    client = s3_server.client()
    log = client.head_object(Bucket=s3_server.bucket, Key=rsm._key(segment.metadata, ObjectType.LOG))
    assert ("-" in log["ETag"]) == (log_size == LARGE_SEGMENT_BYTES)  # a multipart upload
    for key in keys:
        head = client.head_object(Bucket=s3_server.bucket, Key=key)
        assert head["ServerSideEncryption"] == sse, key
        if kms_key_id:
            assert head["SSEKMSKeyId"].endswith(kms_key_id), key


def test_server_side_encryption_settings_are_checked(s3_server: S3Server) -> None:
    with pytest.raises(ValueError, match="sse"):
        manager(s3_server, sse="aes256")
    with pytest.raises(ValueError, match="aws:kms"):
        manager(s3_server, sse="AES256", sse_kms_key_id="alias/x")


async def test_a_read_into_a_buffer_copies_what_aiohttp_received_straight_there(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through aiohttp (bodies not read on threads), a ranged GET's body reaches the buffer
    with one copy: no `read(n)` joining aiohttp's pieces into new bytes, and every block
    checked where it lies in the buffer, none copied together from two pieces first."""
    segment = make_segment(tmp_path, log_size=3 * MIB + 12345)
    buffer = memoryview(bytearray(len(segment.log) - BLOCK_BYTES))
    checked_in_place: list[bool] = []
    joins: list[int] = []
    crc = crc32c.crc32c

    def crc32c_of(data: bytes | memoryview, *args: int) -> int:
        checked_in_place.append(isinstance(data, memoryview) and data.obj is buffer.obj)
        return crc(data, *args)

    read = aiohttp.StreamReader.read

    async def joining_read(self: aiohttp.StreamReader, n: int = -1) -> bytes:
        joins.append(n)
        return await read(self, n)

    async with manager(s3_server, chunk_bytes=MIB, read_bodies_on_threads=False) as rsm:
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        await rsm.fetch_manifest(segment.metadata)  # the manifest's GET is not the read looked at
        monkeypatch.setattr(tierproxy.storage.rsm.crc32c, "crc32c", crc32c_of)
        monkeypatch.setattr(aiohttp.StreamReader, "read", joining_read)
        reads: list[tuple[float, float, int]] = []
        rsm.observe_range_reads(lambda first_byte, rest, size: reads.append((first_byte, rest, size)))
        await rsm.read_log_into(segment.metadata, BLOCK_BYTES, buffer)
    assert bytes(buffer) == segment.log[BLOCK_BYTES:]
    assert joins == []
    [(first_byte, rest, size)] = reads  # what the reader's read-ahead learns the store's latency from
    assert first_byte > 0 and rest > 0 and size == len(buffer)
    assert len(checked_in_place) == -(-len(buffer) // BLOCK_BYTES) and all(checked_in_place)
