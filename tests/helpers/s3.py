"""The S3 backend in tests: a manager of the test's own on an S3 server of the testbed, and
the contract's raw-object hooks over that server's bucket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from typing import Any

from botocore.exceptions import ClientError

from tierproxy.storage.errors import CorruptRemoteSegment, RemoteStorageError
from tierproxy.storage.model import RemoteLogSegmentMetadata
from tierproxy.storage.rsm import RemoteStorageManager
from tierproxy.storage.s3 import MIB, S3RemoteStorageManager
from testbed.ports import LOOPBACK
from testbed.s3 import S3Server

# 12 MiB segments go up in three parts: 5 + 5 + 2 MiB.
PART_BYTES = 5 * MIB
THRESHOLD_BYTES = 6 * MIB


def manager(
    server: S3Server, *, endpoint_url: str | None = None, bucket: str | None = None, **options: object
) -> S3RemoteStorageManager:
    """A manager with its own key prefix, small parts and tiny backoffs."""
    settings = dict(
        multipart_threshold_bytes=THRESHOLD_BYTES,
        multipart_part_bytes=PART_BYTES,
        chunk_bytes=256 * 1024,
        max_connections=8,
        retry_backoff_ms=10,
        retry_backoff_max_ms=50,
        max_attempts=3,
        request_timeout_ms=5000,
        ca_location=str(server.ca) if server.ca else None,  # a server on HTTPS: its CA
    )
    settings.update(options)
    return S3RemoteStorageManager(
        bucket or server.bucket,
        prefix=f"t-{uuid.uuid4().hex[:8]}/tiered",
        endpoint_url=endpoint_url or server.endpoint_url,
        region=server.region,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
        **settings,
    )


class S3Objects:
    """The contract's raw-object hooks (tests/storage/rsm_contract.py) on `self.server`'s bucket."""

    server: S3Server

    def manager_on(self, server: S3Server, **options: object) -> S3RemoteStorageManager:
        """`manager(server, ...)`, whose objects the hooks then reach."""
        self.server = server
        return manager(server, **options)

    async def raw_write(self, rsm: RemoteStorageManager, key: str, data: bytes) -> None:
        await asyncio.to_thread(self.server.client().put_object, Bucket=self.server.bucket, Key=key, Body=data)

    async def raw_delete(self, rsm: RemoteStorageManager, key: str) -> None:
        await asyncio.to_thread(self.server.client().delete_object, Bucket=self.server.bucket, Key=key)

    async def raw_read(self, rsm: RemoteStorageManager, key: str) -> bytes | None:
        def read() -> bytes | None:
            try:
                return self.server.client().get_object(Bucket=self.server.bucket, Key=key)["Body"].read()
            except ClientError as e:
                if e.response["Error"]["Code"] == "NoSuchKey":
                    return None
                raise

        return await asyncio.to_thread(read)


class ResponseRelay:
    """A TCP relay on loopback in front of an S3 endpoint (HTTP or HTTPS alike: bytes pass
    through untouched) that cuts a connection once `cut_after` bytes of responses went down
    it, and with `pace` = (bytes, seconds) sends responses down in such steps: a store whose
    connection dies in the middle of a body, or whose body comes slowly."""

    def __init__(self, target_url: str, *, cut_after: int | None = None,
                 pace: tuple[int, float] | None = None) -> None:
        parts = urllib.parse.urlsplit(target_url)
        self._target = (parts.hostname or LOOPBACK, parts.port or 80)
        self._scheme = parts.scheme
        self._cut_after = cut_after
        self._pace = pace
        self._listener = socket.create_server((LOOPBACK, 0))
        self._sockets: list[socket.socket] = []
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint_url(self) -> str:
        return f"{self._scheme}://{LOOPBACK}:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, None, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self._cut_after, self._pace),
                             daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, cut_after: int | None,
              pace: tuple[int, float] | None) -> None:
        sent = 0
        step = pace[0] if pace else 1 << 16
        try:
            while data := source.recv(step):
                if cut_after is not None and sent + len(data) > cut_after:
                    sink.sendall(data[:cut_after - sent])
                    self.cuts += 1
                    break
                sink.sendall(data)
                sent += len(data)
                if pace:
                    time.sleep(pace[1])
        except OSError:
            pass
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()

    def __enter__(self) -> ResponseRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def read_run(rsm: RemoteStorageManager, metadata: RemoteLogSegmentMetadata, start: int,
                   sizes: list[int]) -> tuple[list[bytes], BaseException | None]:
    """`read_log_run` into fresh buffers of `sizes`: the bytes of each buffer it yielded,
    and the error it ended with (None when it read them all)."""
    buffers = [memoryview(bytearray(size)) for size in sizes]
    filled: list[bytes] = []
    try:
        async for buffer in rsm.read_log_run(metadata, start, buffers):
            filled.append(bytes(buffer))
    except RemoteStorageError as e:
        return filled, e
    return filled, None


@contextlib.asynccontextmanager
async def relayed_copy(server: S3Server, segment: Any, *, cut_after: int | None = None,
                       pace: tuple[int, float] | None = None,
                       **options: object) -> AsyncIterator[tuple[ResponseRelay, S3RemoteStorageManager]]:
    """`segment` copied to `server`, and a manager (with `options`) reading it through a
    ResponseRelay (`cut_after`, `pace`), its manifest already cached: its reads are the log's."""
    async with manager(server) as direct:
        await direct.copy_log_segment_data(segment.metadata, segment.data)
        with ResponseRelay(server.endpoint_url, cut_after=cut_after, pace=pace) as relay:
            async with manager(server, endpoint_url=relay.endpoint_url, **options) as relayed:
                relayed.prefix = direct.prefix
                relayed._manifests[segment.metadata.segment_id] = await direct.fetch_manifest(segment.metadata)
                yield relay, relayed


async def assert_cut_body_fails_only_what_it_did_not_fill(server: S3Server, segment: Any) -> None:
    """`segment` (rsm_contract.make_segment's, 3 MiB or more of log) copied, then read through a
    connection cut after 1.5 MiB of a 3 MiB run's body: the first 1 MiB buffer is read
    and good, the next fails with a retriable error (a connection failure, not corruption),
    and the broken connection is not reused: the next read gets a new one and succeeds."""
    async with relayed_copy(server, segment, cut_after=MIB + MIB // 2) as (relay, relayed):
        filled, error = await read_run(relayed, segment.metadata, 0, [MIB] * 3)
        assert filled == [segment.log[:MIB]]
        assert isinstance(error, RemoteStorageError) and error.retriable
        assert not isinstance(error, CorruptRemoteSegment), error
        assert relay.cuts == 1
        buffer = memoryview(bytearray(MIB))
        await relayed.read_log_into(segment.metadata, MIB, buffer)
        assert bytes(buffer) == segment.log[MIB:2 * MIB]
