"""The interception interface: how a handler takes over one Kafka API.

Every request whose API key has no registered interceptor, or whose version the
interceptor does not handle, is forwarded to the broker as an opaque frame. For the
others the connection calls ``Interceptor.handle`` in a task of its own and writes
what it returns once every older response of the connection went out.

``handle(ctx, header, frame_body, forward)``:

- ``frame_body`` is the client's whole request frame body (request header and
  payload, size prefix removed); the payload starts at ``header.header_size``.
- ``forward(request)`` sends a request frame body (header included) on the same
  client's upstream connection, so it runs with the client's own identity, and
  returns the broker's response payload (response header removed). Pass
  ``frame_body`` to forward the request unchanged, or
  ``protocol.codecs.encode_request(obj, header.correlation_id, header.client_id)``
  to forward a rewritten one. It may be called more than once per request.
- The return value is the client's response: a kio response object of the
  client's request version, or the response payload as one bytes-like object or a
  sequence of them (written with ``writelines``, never joined). The connection adds
  the response header with the client's correlation id.
- An exception closes that client connection with a log line; nothing else is hurt.
  A request that does not parse (``decode_client_request`` raises InvalidRequest)
  is the client's fault: one WARN line, counted as ``bad_request``.
"""

from __future__ import annotations

import asyncio
import logging

from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tierproxy.protocol.codecs import decode_request
from tierproxy.protocol.errors import DecodeError

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from tierproxy.protocol.headers import RequestHeader
    from tierproxy.config import Config
    from tierproxy.proxy.metrics import ProxyMetrics

log = logging.getLogger(__name__)

__all__ = (
    "ConnectionContext",
    "Forward",
    "Interceptor",
    "InterceptorRegistry",
    "InvalidRequest",
    "NodeDirectory",
    "ProxyServices",
    "Response",
    "decode_client_request",
)

Forward = Callable[["Buffer | Sequence[Buffer]"], Awaitable[memoryview]]
"""Send a request frame body upstream on the client's connection; get the response payload."""

Response = Any
"""A kio response object, or the response payload as a bytes-like object or a sequence of them."""


class InvalidRequest(Exception):
    """The client's request does not parse. Like a broker, the proxy closes the
    connection (with one WARN line; the client's bytes are no proxy fault)."""


def decode_client_request(header: RequestHeader, frame_body: memoryview) -> Any:
    """The payload of a client's request as a kio object, or InvalidRequest."""
    try:
        return decode_request(header.api_key, header.api_version, frame_body[header.header_size:])
    except DecodeError as e:
        raise InvalidRequest(str(e)) from None


class NodeDirectory(Protocol):
    """Where broker nodes really are and where clients are told they are."""

    async def learn(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        """Record a broker node's address, make sure its proxy listener is open, and
        return the (host, port) to advertise to clients for it."""
        ...

    def advertised(self, node_id: int) -> tuple[str, int]:
        """The proxy's (host, port) for a broker node."""
        ...


@dataclass(frozen=True, eq=False)
class ProxyServices:
    """What every connection of one proxy shares."""

    config: Config
    metrics: ProxyMetrics
    nodes: NodeDirectory
    interceptors: InterceptorRegistry


@dataclass(eq=False, slots=True)
class ConnectionContext:
    """One client connection, as its interceptors see it."""

    peer: str
    """The client's address, `host:port`."""
    node_id: int | None
    """The broker node the client addressed; None on the bootstrap listener."""
    broker: tuple[str, int]
    """The broker address the upstream connection went to."""
    services: ProxyServices
    state: dict[str, Any] = field(default_factory=dict)
    """Per-connection state of the interceptors (e.g. the Fetch handler's proofs)."""


class Interceptor:
    """Base of the handlers of one API. Subclasses set ``api_key`` and ``versions``."""

    api_key: int
    versions: range
    """Request versions this interceptor handles; other versions pass through."""

    def advertised_versions(self, broker_min: int, broker_max: int) -> tuple[int, int]:
        """The (min, max) ApiVersions offers clients, given the broker's range.

        By default the broker's range, capped at what this interceptor handles;
        overriding may raise the max (an API the proxy answers partly itself).
        """
        top = min(broker_max, self.versions.stop - 1)
        return (broker_min, top) if top >= broker_min else (broker_min, broker_max)

    async def handle(
        self, ctx: ConnectionContext, header: RequestHeader, frame_body: memoryview, forward: Forward
    ) -> Response:
        raise NotImplementedError

    async def start(self) -> None:
        """Called once when the proxy starts (open clients, load caches)."""

    async def close(self) -> None:
        """Called once when the proxy stops."""


class InterceptorRegistry:
    """The interceptors of one proxy, one per API key."""

    def __init__(self, interceptors: Iterable[Interceptor] = ()) -> None:
        self._by_key: dict[int, Interceptor] = {}
        for interceptor in interceptors:
            self.register(interceptor)

    def register(self, interceptor: Interceptor, *, replace: bool = False) -> None:
        key = int(interceptor.api_key)
        if key in self._by_key and not replace:
            raise ValueError(f"api key {key} already has {self._by_key[key]!r}")
        self._by_key[key] = interceptor

    def get(self, api_key: int) -> Interceptor | None:
        return self._by_key.get(api_key)

    def lookup(self, api_key: int, api_version: int) -> Interceptor | None:
        """The interceptor of this request, or None for the pass-through path."""
        interceptor = self._by_key.get(api_key)
        if interceptor is not None and api_version in interceptor.versions:
            return interceptor
        return None

    def __iter__(self) -> Iterator[Interceptor]:
        return iter(self._by_key.values())

    async def start(self) -> None:
        for interceptor in self:
            await interceptor.start()

    async def close(self) -> None:
        # One failing close must not keep the others open.
        results = await asyncio.gather(*(i.close() for i in self), return_exceptions=True)
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            raise errors[0]
        # A client library cancelling its own tasks while it stops (aiokafka, with the
        # broker already gone) is no failure of the proxy's shutdown.
        for interceptor, result in zip(self, results):
            if isinstance(result, asyncio.CancelledError):
                log.warning("closing %r was cancelled inside; it is closed all the same", interceptor)
