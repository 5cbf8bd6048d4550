"""Remote segments in an S3 bucket, through aiobotocore.

Reads are ranged GETs streamed in chunks; a read into the caller's buffers (`read_log_into`,
`read_log_run`: the chunk cache's loads) and a whole object's GET (manifests, indexes) are
read by `storage.s3_bodies` on threads of its own, a body going from the socket (or TLS)
straight into the buffers; with `read_bodies_on_threads` off (or without credentials to sign
with) they go through aiobotocore, each piece aiohttp received copied into the buffers,
never joined into new bytes on the way (`_body_into`). Segments above a threshold go up as
multipart uploads, aborted when any part fails. With `sse` every PUT and multipart upload
asks for server-side encryption (SSE-S3 `AES256`, or SSE-KMS `aws:kms` with `sse_kms_key_id`);
reads need nothing for it. Every upload carries its CRC-32C, which S3 checks on arrival
and keeps with the object; `verify_segment` reads it with a HEAD instead of reading the
object back (which it does where the store keeps none, or for an object written without one).

Retries are ours, not botocore's (its retry budget is set to one attempt): Kafka's exponential backoff with jitter
(`storage.backoff`, from `remote.log.manager.task.retry.backoff.ms`, `.retry.backoff.max.ms`
and `.retry.jitter`), on retriable failures only, and for a proxy's read only while the
fetch waiting for it still waits (`storage.backoff.read_deadline`). A failure while a response body is
being streamed is not retried here (bytes may already be with the caller); it
surfaces as a retriable RemoteStorageError.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import aiohttp
import crc32c
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore import exceptions as boto

from tierproxy.config import S3_SSE_MODES

from .backoff import ExponentialBackoff, retry_fits
from .errors import CorruptRemoteSegment, RemoteResourceNotFound, RemoteStorageError
from .encryption import KeyRing
from .manifest import Crc32cAccumulator, ObjectEntry, entry_of
from .rsm import ObjectStoreRemoteStorageManager
from .s3_bodies import Endpoint, ObjectBodies, RangedBody, tls_context

MIB = 1 << 20
S3_MIN_PART_BYTES = 5 * MIB  # every part but the last (S3's limit)
S3_MAX_PARTS = 10_000
DELETE_BATCH = 1000  # keys per DeleteObjects request (S3's limit)

# Error codes S3 (and compatible stores) answer when asked to slow down.
_THROTTLING_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
}
_NOT_FOUND_CODES = {"NoSuchKey", "NotFound", "404"}

T = TypeVar("T")


def storage_error(error: BaseException, what: str) -> RemoteStorageError:
    """Translate an aiobotocore/aiohttp/OS failure into the storage errors."""
    if isinstance(error, RemoteStorageError):
        return error
    if isinstance(error, boto.ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _NOT_FOUND_CODES or (status == 404 and code != "NoSuchBucket"):
            return RemoteResourceNotFound(f"{what}: not found ({code or status})")
        retriable = status >= 500 or status in (408, 429) or code in _THROTTLING_CODES
        return RemoteStorageError(f"{what}: {code} (HTTP {status}): {error}", retriable=retriable)
    if isinstance(error, boto.SSLError):
        return RemoteStorageError(f"{what}: {error}", retriable=False)
    if isinstance(
        error,
        (
            boto.ConnectionError,
            boto.HTTPClientError,
            boto.IncompleteReadError,
            aiohttp.ClientError,
            asyncio.TimeoutError,
            OSError,
        ),
    ):
        return RemoteStorageError(f"{what}: {type(error).__name__}: {error}", retriable=True)
    if isinstance(error, boto.BotoCoreError):
        # Credentials, parameter validation, configuration: a retry will not help.
        return RemoteStorageError(f"{what}: {type(error).__name__}: {error}", retriable=False)
    raise error  # a bug of ours, not a storage failure: let it show as what it is


class S3RemoteStorageManager(ObjectStoreRemoteStorageManager):
    # Each GET costs botocore and aiohttp about a millisecond of CPU, whatever its size.
    reads_runs = True

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        multipart_threshold_bytes: int = 16 * MIB,
        multipart_part_bytes: int = 8 * MIB,
        max_connections: int = 32,
        retry_backoff_ms: int = 500,
        retry_backoff_max_ms: int = 30_000,
        retry_jitter: float = 0.2,
        max_attempts: int = 5,
        request_timeout_ms: int = 30_000,
        chunk_bytes: int = MIB,
        manifest_cache_size: int = 1024,
        keys: KeyRing | None = None,
        sse: str = "",
        sse_kms_key_id: str = "",
        ca_location: str | None = None,
        read_bodies_on_threads: bool = True,
    ) -> None:
        if multipart_part_bytes < S3_MIN_PART_BYTES:
            raise ValueError(f"multipart_part_bytes must be at least {S3_MIN_PART_BYTES}, got {multipart_part_bytes}")
        if multipart_threshold_bytes < 1:
            raise ValueError(f"multipart_threshold_bytes must be positive, got {multipart_threshold_bytes}")
        if max_connections < 1 or max_attempts < 1 or chunk_bytes < 1 or request_timeout_ms < 1:
            raise ValueError("max_connections, max_attempts, chunk_bytes and request_timeout_ms must be positive")
        if sse not in S3_SSE_MODES or (sse_kms_key_id and sse != "aws:kms"):
            raise ValueError(f"sse must be one of {S3_SSE_MODES}, and a KMS key id needs aws:kms; got {sse!r}")
        self.backoff = ExponentialBackoff(retry_backoff_ms, retry_backoff_max_ms, retry_jitter)
        super().__init__(prefix=prefix, manifest_cache_size=manifest_cache_size, keys=keys)
        # Arguments of every PutObject and CreateMultipartUpload.
        self._sse = {"ServerSideEncryption": sse} if sse else {}
        if sse_kms_key_id:
            self._sse["SSEKMSKeyId"] = sse_kms_key_id
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.region = region
        self.multipart_threshold_bytes = multipart_threshold_bytes
        self.multipart_part_bytes = multipart_part_bytes
        self.max_attempts = max_attempts
        self.chunk_bytes = chunk_bytes
        self._credentials = (access_key_id, secret_access_key)
        # PEM CA certificates verifying an HTTPS endpoint; None for the system's (botocore's).
        self._verify = ca_location
        timeout_s = request_timeout_ms / 1000
        self._config = AioConfig(
            max_pool_connections=max_connections,
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
            retries={"total_max_attempts": 1, "mode": "standard"},
            # Path-style addressing for S3-compatible stores (moto, MinIO) on a plain endpoint.
            s3={"addressing_style": "path"} if endpoint_url else None,
            # Uploads send the CRC-32C the manifest records themselves (botocore's own
            # CRC-32C needs awscrt), and reads are checked against the manifest.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self._client: Any = None
        self._client_stack: contextlib.AsyncExitStack | None = None
        self._client_lock = asyncio.Lock()
        self._closed = False
        self._max_connections = max_connections
        self._timeout_s = timeout_s
        # Bulk bodies on threads (`storage.s3_bodies`), set up with the client; None when
        # off, or for a client that signs nothing (no credentials).
        self._read_bodies_on_threads = read_bodies_on_threads
        self._bodies: ObjectBodies | None = None

    async def start(self) -> None:
        # Making the client loads botocore's service model and endpoint rules: about 0.15 s
        # of CPU that the first ranged read would otherwise wait for.
        await self._s3()

    async def close(self) -> None:
        self._closed = True
        async with self._client_lock:
            stack, self._client_stack, self._client = self._client_stack, None, None
            bodies, self._bodies = self._bodies, None
            if stack is not None:
                await stack.aclose()
            if bodies is not None:
                bodies.close()

    async def _s3(self) -> Any:
        """The one client of this instance, created on first use."""
        if self._client is not None:
            return self._client
        async with self._client_lock:
            if self._closed:
                raise RemoteStorageError("S3 remote storage manager is closed", retriable=False)
            if self._client is None:
                access_key_id, secret_access_key = self._credentials
                stack = contextlib.AsyncExitStack()
                self._client = await stack.enter_async_context(
                    get_session().create_client(
                        "s3",
                        endpoint_url=self.endpoint_url,
                        region_name=self.region,
                        aws_access_key_id=access_key_id,
                        aws_secret_access_key=secret_access_key,
                        verify=self._verify,
                        config=self._config,
                    )
                )
                if self._read_bodies_on_threads:
                    try:
                        self._bodies = await self._object_bodies(self._client)
                    except BaseException as e:
                        self._client = None
                        await stack.aclose()
                        if isinstance(e, Exception):
                            raise storage_error(e, f"s3://{self.bucket}: resolving its endpoint") from e
                        raise
                self._client_stack = stack
            return self._client

    async def _object_bodies(self, client: Any) -> ObjectBodies | None:
        """Bulk bodies read on threads, at the endpoint botocore resolves for this bucket (its
        endpoint rules run once, here, for a presigned GetObject), verifying TLS as the
        client does. None when the client has no credentials to sign with."""
        if await self._frozen_credentials(client) is None:
            return None
        probe = "k"
        url = await client.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": probe})
        endpoint = Endpoint.of_url(url, probe, client.meta.region_name)
        verify = getattr(getattr(client._endpoint, "http_session", None), "_verify", self._verify)
        tls = await asyncio.to_thread(tls_context, verify) if endpoint.scheme == "https" else None
        return ObjectBodies(endpoint, max_connections=self._max_connections, timeout_s=self._timeout_s, tls=tls)

    @staticmethod
    async def _frozen_credentials(client: Any) -> Any:
        """The client's credentials as they are now (refreshed when they expire), or None."""
        credentials = client._request_signer._credentials
        return None if credentials is None else await credentials.get_frozen_credentials()

    async def _call(self, operation: str, what: str, request: Callable[[Any], Awaitable[T]]) -> T:
        """Run `request(client)`, retrying retriable failures with backoff; every attempt is
        reported to `observe_request` under `operation` (get, get_range, put, ...)."""
        attempt = 0
        while True:
            started = time.monotonic()
            try:
                result = await request(await self._s3())
                self.observe_request(operation, time.monotonic() - started, True)
                return result
            except Exception as e:  # noqa: BLE001 - storage_error re-raises what is not ours
                self.observe_request(operation, time.monotonic() - started, False)
                error = storage_error(e, f"{what} (attempt {attempt + 1} of {self.max_attempts})")
                if not error.retriable or attempt + 1 >= self.max_attempts:
                    raise error from e
                delay = self.backoff.backoff_ms(attempt) / 1000
                if not retry_fits(delay):  # a fetch is waiting: it answers with the error now
                    raise error from e
            await asyncio.sleep(delay)
            attempt += 1

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    # -- primitives -------------------------------------------------------------

    async def _put_stream(self, key: str, chunks: Iterator[bytes], size: int) -> ObjectEntry:
        if size < self.multipart_threshold_bytes:
            data = await asyncio.to_thread(b"".join, chunks)  # below the threshold: bounded by configuration
            entry = entry_of(data)
            await self._put_object(key, data, entry.crc32c)
            return entry
        return await self._put_multipart(key, _Parts(chunks, self.multipart_part_bytes))

    async def _put_multipart(self, key: str, source: _Parts) -> ObjectEntry:
        where = self._where(key)
        created = await self._call(
            "create_multipart_upload",
            f"create multipart upload {where}",
            lambda s3: s3.create_multipart_upload(Bucket=self.bucket, Key=key, **self._sse, **_CRC32C_UPLOAD),
        )
        upload_id = created["UploadId"]
        crc = Crc32cAccumulator()
        parts: list[dict[str, Any]] = []
        try:
            try:
                while part := await asyncio.to_thread(source.take):
                    number = len(parts) + 1
                    if number > S3_MAX_PARTS:
                        raise RemoteStorageError(f"{where}: more than {S3_MAX_PARTS} parts", retriable=False)
                    crc.update(part)
                    part_crc = _crc32c_header(crc32c.crc32c(part))
                    response = await self._call(
                        "upload_part",
                        f"upload part {number} of {where}",
                        lambda s3: s3.upload_part(  # awaited before the loop moves on
                            Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=part,
                            ChecksumAlgorithm="CRC32C", ChecksumCRC32C=part_crc,
                        ),
                    )
                    parts.append({"PartNumber": number, "ETag": response["ETag"], "ChecksumCRC32C": part_crc})
            finally:
                await asyncio.to_thread(source.close)
            await self._call(
                "complete_multipart_upload",
                f"complete multipart upload {where}",
                lambda s3: s3.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts},
                    ChecksumType="FULL_OBJECT", ChecksumCRC32C=_crc32c_header(crc.crc),
                ),
            )
        except BaseException:
            # Parts of an unfinished upload are stored (and billed) until aborted.
            with contextlib.suppress(Exception):
                client = await self._s3()
                await client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise
        return crc.entry()

    async def _put_bytes(self, key: str, data: bytes) -> None:
        await self._put_object(key, data, crc32c.crc32c(data))

    async def _put_object(self, key: str, data: bytes, crc: int) -> None:
        """PutObject with the CRC-32C of `data`: S3 refuses the upload if the bytes it got
        differ, and keeps the checksum for `_stored_checksum`."""
        await self._call(
            "put",
            f"put {self._where(key)}",
            lambda s3: s3.put_object(Bucket=self.bucket, Key=key, Body=data, **self._sse,
                                     ChecksumAlgorithm="CRC32C", ChecksumCRC32C=_crc32c_header(crc)),
        )

    async def _get_bytes(self, key: str) -> bytes:
        async def get(s3: Any) -> bytes:
            if self._bodies is not None:
                return await self._bodies.get_object(key, await self._frozen_credentials(s3))
            response = await s3.get_object(Bucket=self.bucket, Key=key)
            async with response["Body"] as body:
                return await body.read()

        return await self._call("get", f"get {self._where(key)}", get)

    @contextlib.asynccontextmanager
    async def _open_range(
        self, key: str, first: int, last: int, into: Sequence[memoryview] = ()
    ) -> AsyncIterator[tuple[int, AsyncGenerator[bytes | memoryview, None]]]:
        where = self._where(key)
        await self._s3()  # the client, and with it the bodies' connections
        bodies = self._bodies if into else None

        async def get_range(s3: Any) -> Any:
            if bodies is not None:
                return await bodies.get_range(key, first, last, await self._frozen_credentials(s3))
            return await s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={first}-{last}")

        try:
            response = await self._call("get_range", f"get {where} bytes {first}-{last}", get_range)
        except RemoteStorageError as e:
            if not _is_invalid_range(e):
                raise
            # The object is shorter than the range starts: report its real size and no
            # bytes, so the caller's size check names the problem.
            size = await self._object_size(key)
            if size is None:
                raise RemoteResourceNotFound(f"{where} not found") from e
            yield size, _no_chunks()
            return
        if isinstance(response, RangedBody):
            try:
                yield response.size, _ranged_body_into(response, into, where)
            finally:
                response.close()
            return
        body = response["Body"]
        try:
            size = _object_size_of(response, where)
            received = _received_chunks(body)
            if not into or received is None:
                yield size, self._body_chunks(body, where)
            else:
                yield size, _body_into(received, into, where)
        finally:
            body.close()

    async def _body_chunks(self, body: Any, where: str) -> AsyncGenerator[bytes, None]:
        while True:
            try:
                chunk = await body.read(self.chunk_bytes)
            except Exception as e:  # noqa: BLE001 - storage_error re-raises what is not ours
                raise storage_error(e, f"reading {where}") from e
            if not chunk:
                return
            yield chunk

    async def _object_size(self, key: str) -> int | None:
        try:
            response = await self._call(
                "head",
                f"head {self._where(key)}", lambda s3: s3.head_object(Bucket=self.bucket, Key=key)
            )
        except RemoteResourceNotFound:
            return None
        return int(response["ContentLength"])

    async def _stored_checksum(self, key: str) -> tuple[int, int | None] | None:
        try:
            response = await self._call(
                "head",
                f"head {self._where(key)}",
                lambda s3: s3.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED"),
            )
        except RemoteResourceNotFound:
            return None
        return int(response["ContentLength"]), _recorded_crc32c(response)

    async def _delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for start in range(0, len(keys), DELETE_BATCH):
            batch = keys[start : start + DELETE_BATCH]
            what = f"delete {len(batch)} objects from s3://{self.bucket} ({batch[0]}...)"
            response = await self._call(
                "delete",
                what,
                lambda s3: s3.delete_objects(  # awaited before the loop moves on
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                ),
            )
            # S3 reports per-key failures in a 200 response; a missing key is not one of them.
            failures = response.get("Errors") or []
            if failures:
                first = failures[0]
                raise RemoteStorageError(
                    f"{what}: {len(failures)} failed, first {first.get('Key')}: "
                    f"{first.get('Code')} {first.get('Message')}",
                    retriable=any(f.get("Code") in _THROTTLING_CODES for f in failures),
                )

    async def _list(self, key_prefix: str) -> list[str]:
        keys: list[str] = []
        token: str | None = None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            page = await self._call(
                "list",
                f"list s3://{self.bucket}/{key_prefix}",
                lambda s3: s3.list_objects_v2(Bucket=self.bucket, Prefix=key_prefix, **extra),
            )
            keys.extend(item["Key"] for item in page.get("Contents", ()))
            if not page.get("IsTruncated"):
                return keys
            token = page["NextContinuationToken"]


def _is_invalid_range(error: RemoteStorageError) -> bool:
    cause = error.__cause__
    return isinstance(cause, boto.ClientError) and (
        cause.response.get("Error", {}).get("Code") == "InvalidRange"
        or cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 416
    )


# Every upload carries the object's CRC-32C (S3's "additional checksum"): S3 checks the bytes
# it receives against it and keeps it with the object, where a HEAD reads it back. A multipart
# upload asks for the checksum of the whole object (FULL_OBJECT), not one of its parts' checksums.
_CRC32C_UPLOAD = {"ChecksumAlgorithm": "CRC32C", "ChecksumType": "FULL_OBJECT"}


def _crc32c_header(crc: int) -> str:
    """A CRC-32C as S3's x-amz-checksum-crc32c writes it: base64 of its 4 big-endian bytes."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


def _recorded_crc32c(response: dict[str, Any]) -> int | None:
    """The whole object's CRC-32C from a HEAD with ChecksumMode=ENABLED; None when the object
    was stored without one (written before uploads carried it, by another tool, or by a store
    that keeps none) or with a checksum of its parts only (`...-N`)."""
    value = response.get("ChecksumCRC32C")
    if not value or response.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        return None  # "...-N": a composite checksum of the parts
    return int.from_bytes(raw, "big") if len(raw) == 4 else None


def _received_chunks(body: Any) -> Callable[[], Awaitable[tuple[bytes, bool]]] | None:
    """`readchunk` of the aiohttp stream under aiobotocore's body: each call hands over the
    next piece aiohttp received as it is, where `read(n)` joins pieces into new bytes.
    None for a body over another HTTP client."""
    content = getattr(getattr(body, "raw_stream", None), "content", None)
    return content.readchunk if isinstance(content, aiohttp.StreamReader) else None


async def _body_into(readchunk: Callable[[], Awaitable[tuple[bytes, bool]]], into: Sequence[memoryview],
                     where: str) -> AsyncGenerator[memoryview, None]:
    """The body copied into the buffers of `into`, in turn, piece by piece as aiohttp received
    it (the one copy out of the HTTP client's buffers), yielding the view of a buffer each
    piece filled (a piece running past a buffer's end is two)."""
    targets = iter(into)
    target, filled = next(targets), 0
    while True:
        try:
            piece, end_of_http_chunk = await readchunk()
        except Exception as e:  # noqa: BLE001 - storage_error re-raises what is not ours
            raise storage_error(e, f"reading {where}") from e
        if not piece:
            if end_of_http_chunk:
                continue  # a chunked body's chunk boundary, not its end
            return
        view = memoryview(piece)
        while view:
            if filled == len(target):
                following = next(targets, None)
                if following is None:
                    raise CorruptRemoteSegment(f"{where}: more than the {sum(map(len, into))} bytes asked for")
                target, filled = following, 0
            end = min(len(target), filled + len(view))
            target[filled:end] = view[:end - filled]
            yield target[filled:end]
            view = view[end - filled:]
            filled = end


async def _ranged_body_into(body: RangedBody, into: Sequence[memoryview],
                            where: str) -> AsyncGenerator[memoryview, None]:
    """The body read into the buffers of `into` in turn, each yielded once it is full."""
    for target in into:
        try:
            await body.read_into(target)
        except Exception as e:  # noqa: BLE001 - storage_error re-raises what is not ours
            raise storage_error(e, f"reading {where}") from e
        yield target
    if body.left:
        raise CorruptRemoteSegment(f"{where}: more than the {sum(map(len, into))} bytes asked for")


async def _no_chunks() -> AsyncGenerator[bytes, None]:
    return
    yield


def _object_size_of(response: dict[str, Any], where: str) -> int:
    """Total object size from a ranged GET's `Content-Range: bytes a-b/total`."""
    content_range = response.get("ContentRange") or ""
    _, _, total = content_range.rpartition("/")
    if not total.isdigit():
        raise RemoteStorageError(f"{where}: no object size in Content-Range {content_range!r}", retriable=False)
    return int(total)


class _Parts:
    """Parts of `part_bytes` (the last may be shorter) taken from a stream of chunks of any
    size; `take` and `close` run in a worker thread, as the stream reads a file."""

    def __init__(self, chunks: Iterator[bytes], part_bytes: int) -> None:
        self._chunks = chunks
        self._part_bytes = part_bytes
        self._buffer = bytearray()

    def take(self) -> bytes:
        """The next part; empty at the end."""
        while len(self._buffer) < self._part_bytes:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        part = bytes(self._buffer[:self._part_bytes])
        del self._buffer[:self._part_bytes]
        return part

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()  # a generator reading a file closes it
