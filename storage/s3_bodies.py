"""Object bodies read straight into the caller's buffers: ranged GETs on threads of their own.

Through aiobotocore a body comes up in pieces of a few KiB, each a new bytes object handed
to Python (and, over TLS, decrypted by the event loop into new bytes first), and every GET
costs botocore a millisecond or so of CPU to resolve, sign and parse. The bulk bodies (a
`.log` range read into chunk buffers) go here instead, and so do the small whole objects
a cold segment is read with (manifest, indexes): one http.client connection per read in
flight, kept alive and pooled; the request signed with botocore's own SigV4 signer
for an endpoint botocore resolved once; the body read with `readinto` into the buffer, down
to the socket's (or TLS's) `recv_into`, on a thread that holds no GIL while the kernel and
the cipher work. Uploads, listings, deletes and HEADs stay with aiobotocore.

Failures are raised as botocore raises them (ClientError with S3's error code and the HTTP
status, OSError for the connection, IncompleteReadError for a body cut short), so the
caller's `storage_error` maps them to the same storage errors as aiobotocore's.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import ssl
import threading
import urllib.parse
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from botocore import exceptions as boto
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest

# An error response's body is a short XML document; more than this is not read.
_ERROR_BODY_BYTES = 64 << 10

T = TypeVar("T")


@dataclass(frozen=True)
class Endpoint:
    """Where the bucket's objects are: botocore's resolution of a GetObject, done once."""

    scheme: str
    host: str
    port: int
    path_prefix: str  # "/bucket/" path-style, "/" virtual-hosted
    region: str

    @classmethod
    def of_url(cls, object_url: str, key: str, region: str) -> Endpoint:
        """From the URL botocore made for the object `key` (a presigned GetObject)."""
        parts = urllib.parse.urlsplit(object_url)
        quoted = quote_key(key)
        if not parts.path.endswith(quoted) or parts.hostname is None:
            raise ValueError(f"cannot tell the endpoint from {object_url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path[:len(parts.path) - len(quoted)], region)

    @property
    def netloc(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


def quote_key(key: str) -> str:
    """An object key in a request's path, as S3's SigV4 canonical URI encodes it."""
    return urllib.parse.quote(key, safe="/~")


def tls_context(verify: bool | str | None) -> ssl.SSLContext:
    """A client context verifying as botocore's `verify` says: a CA bundle's path, True for
    botocore's default bundle, False for no verification."""
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    from botocore.httpsession import get_cert_path

    cafile: Any = get_cert_path(True if verify is None else verify)  # type: ignore[arg-type]  # a path too
    return ssl.create_default_context(cafile=cafile)


class RangedBody:
    """A ranged GET's response: `size` is the object's whole size (its Content-Range); the
    body is read into buffers in turn with `read_into`, each filled whole or failing."""

    def __init__(self, bodies: ObjectBodies, connection: http.client.HTTPConnection, sock: socket.socket,
                 response: http.client.HTTPResponse, size: int, length: int) -> None:
        self._bodies = bodies
        self._connection: http.client.HTTPConnection | None = connection
        # The response reads from it even when the connection let go of it (a server that
        # closes after this response).
        self._socket = sock
        self._response = response
        self.size = size
        self.left = length  # body bytes not read yet
        self._reading: asyncio.Future[int] | None = None

    async def read_into(self, target: memoryview) -> None:
        """Fill `target` with the next `len(target)` bytes of the body, on a reader thread."""
        if len(target) > self.left:
            raise boto.IncompleteReadError(actual_bytes=self.left, expected_bytes=len(target))
        self._reading = self._bodies.run(self._fill, target)
        try:
            await asyncio.shield(self._reading)
        except asyncio.CancelledError:
            # The thread writes into `target` until it is done: the caller may reuse the
            # buffer only after that, so the read is cut and waited for.
            self.close()
            await _settled(self._reading)
            raise

    def _fill(self, target: memoryview) -> int:
        # HTTPResponse.readinto goes down to BufferedReader.readinto, which loops over
        # recv_into into `target` itself until it is full or the connection ends.
        filled = 0
        while filled < len(target):
            try:
                n = self._response.readinto(target[filled:])
            except http.client.HTTPException as e:  # a chunked body cut short
                raise boto.IncompleteReadError(actual_bytes=filled, expected_bytes=len(target)) from e
            if not n:
                self.left -= filled
                raise boto.IncompleteReadError(actual_bytes=filled, expected_bytes=len(target))
            filled += n
        self.left -= filled
        return filled

    def close(self) -> None:
        """Give the connection back when the body was read to its end, else close it (a
        connection in the middle of a body carries nothing another request could use). A
        read still running on a thread fails at once."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._reading is not None and not self._reading.done():
            _cut(connection, self._socket)
            return
        self._bodies.release(connection, reusable=self.left == 0 and self._response.isclosed()
                             and connection.sock is not None)


class ObjectBodies:
    """Ranged GETs of one bucket's objects over a pool of keep-alive connections, at most
    `max_connections` of them at once, each read on a thread of the pool's own."""

    def __init__(self, endpoint: Endpoint, *, max_connections: int, timeout_s: float,
                 tls: ssl.SSLContext | None) -> None:
        if endpoint.scheme == "https" and tls is None:
            raise ValueError("an https endpoint needs a TLS context")
        self.endpoint = endpoint
        self._timeout_s = timeout_s
        self._tls = tls
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_connections, thread_name_prefix="tierproxy-s3-body")
        self._closed = False

    def run(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def get_range(self, key: str, first: int, last: int, credentials: Any) -> RangedBody:
        """Send GET of bytes [first, last] of `key`, signed with `credentials` (botocore's
        frozen ones), and read the response's head; the body is left to `RangedBody`."""
        path = self.endpoint.path_prefix + quote_key(key)
        headers = self._signed(path, {"Range": f"bytes={first}-{last}"}, credentials)
        future = self.run(self._request, path, headers)
        try:
            connection, sock, response = await asyncio.shield(future)
        except asyncio.CancelledError:
            opened = await _settled(future)
            if opened is not None:
                opened[0].close()
            raise
        try:
            size, length = _range_of(response, last - first + 1)
        except BaseException:
            connection.close()
            raise
        return RangedBody(self, connection, sock, response, size, length)

    async def get_object(self, key: str, credentials: Any) -> bytes:
        """A whole object (a manifest, an index), request and body on a reader thread: the
        GETs of a cold segment cost the event loop no botocore work either. A cancelled call
        leaves the thread to finish into memory of its own."""
        path = self.endpoint.path_prefix + quote_key(key)
        return await self.run(self._whole, path, self._signed(path, {}, credentials))

    def _whole(self, path: str, headers: dict[str, str]) -> bytes:
        connection, _, response = self._request(path, headers)
        try:
            data = response.read()
        except http.client.IncompleteRead as e:
            connection.close()
            raise boto.IncompleteReadError(actual_bytes=len(e.partial),
                                           expected_bytes=len(e.partial) + (e.expected or 0)) from e
        except BaseException:
            connection.close()
            raise
        self.release(connection, reusable=response.isclosed() and connection.sock is not None)
        return data

    def _signed(self, path: str, headers: dict[str, str], credentials: Any) -> dict[str, str]:
        endpoint = self.endpoint
        request = AWSRequest(method="GET", url=f"{endpoint.scheme}://{endpoint.netloc}{path}", headers=headers)
        S3SigV4Auth(credentials, "s3", endpoint.region).add_auth(request)
        return dict(request.headers.items())

    def _request(self, path: str, headers: dict[str, str]) -> tuple[http.client.HTTPConnection, socket.socket,
                                                                    http.client.HTTPResponse]:
        """The request sent and its response's head read, with an error response raised as
        a ClientError. A kept-alive connection the server has closed meanwhile is replaced
        by a new one once: the request never reached the server."""
        connection, reused = self._connection()
        try:
            try:
                sock, response = _exchange(connection, path, headers)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if not reused:
                    raise
                connection.close()
                connection = self._new_connection()
                sock, response = _exchange(connection, path, headers)
            if response.status not in (200, 206):
                error = _client_error(response)
                self.release(connection, reusable=response.isclosed())
                raise error
        except boto.ClientError:
            raise
        except http.client.HTTPException as e:  # a response that is not HTTP
            connection.close()
            raise boto.HTTPClientError(error=f"{type(e).__name__}: {e}") from e
        except ssl.SSLCertVerificationError as e:
            connection.close()
            # As botocore reports it: no retry will make the certificate trusted.
            raise boto.SSLError(endpoint_url=f"{self.endpoint.scheme}://{self.endpoint.netloc}", error=e) from e
        except BaseException:
            connection.close()
            raise
        return connection, sock, response

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._new_connection(), False

    def _new_connection(self) -> http.client.HTTPConnection:
        endpoint = self.endpoint
        if endpoint.scheme == "https":
            return http.client.HTTPSConnection(endpoint.host, endpoint.port, timeout=self._timeout_s,
                                               context=self._tls)
        return http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=self._timeout_s)

    def release(self, connection: http.client.HTTPConnection, *, reusable: bool) -> None:
        with self._lock:
            if reusable and not self._closed:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        self._executor.shutdown(wait=False)


def _range_of(response: http.client.HTTPResponse, asked: int) -> tuple[int, int]:
    """(object size, body length) of a ranged GET's response."""
    content_range = response.getheader("Content-Range") or ""
    _, _, total = content_range.rpartition("/")
    length = response.length
    if response.status == 200:  # a store that ignored the range: the whole object
        if length is None:
            raise boto.HTTPClientError(error="a GET answered without a Content-Length")
        return length, length
    if not total.isdigit():
        raise boto.HTTPClientError(error=f"no object size in Content-Range {content_range!r}")
    return int(total), asked if length is None else length


def _client_error(response: http.client.HTTPResponse) -> boto.ClientError:
    """An S3 error response as botocore reports it: its `<Code>` and `<Message>`."""
    body = response.read(_ERROR_BODY_BYTES)
    code, message = str(response.status), response.reason
    try:
        root = ElementTree.fromstring(body)
        code = root.findtext("Code") or code
        message = root.findtext("Message") or message
    except ElementTree.ParseError:
        pass
    parsed: Any = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": response.status}}
    return boto.ClientError(parsed, "GetObject")


def _exchange(connection: http.client.HTTPConnection, path: str,
              headers: dict[str, str]) -> tuple[socket.socket, http.client.HTTPResponse]:
    """GET sent and the response's head read, with the socket it came on: taken before the
    head, as a response that closes the connection makes the connection let go of it."""
    if connection.sock is None:
        try:
            connection.connect()
        except ssl.SSLCertVerificationError:
            raise
        except OSError as e:  # nothing answers there: as botocore says it
            raise boto.EndpointConnectionError(endpoint_url=f"{connection.host}:{connection.port}", error=e) from e
    connection.request("GET", path, headers=headers)
    sock = connection.sock
    assert sock is not None  # a request opens the connection
    return sock, connection.getresponse()


def _cut(connection: http.client.HTTPConnection, sock: socket.socket) -> None:
    """Make a read blocked on `sock` in another thread return at once. Only the socket's
    shutdown, not an SSLSocket's, which drops its TLS state under the reader."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass
    connection.close()


async def _settled(future: asyncio.Future[T]) -> T | None:
    """Wait for a thread's work to finish, whatever it ended with, even when cancelled
    meanwhile (the thread holds memory of the caller's until then)."""
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError:
            continue
    if future.cancelled() or future.exception() is not None:
        return None
    return future.result()
