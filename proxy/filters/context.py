"""What a filter sees of the proxy and of one client connection.

The context holds what is true of the connection itself: the client's address, the
broker it reaches, the broker's API versions on it, the proxy's own correlation ids.
A filter's state of a connection belongs to the filter: it declares a `PerConnection`
with the factory that makes it, and gets the connection's own with `of(ctx)` (as
Kroxylicious' filter factories make a filter instance per connection); a new stateful
filter changes nothing here, and a connection's state is never seen by another one.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from tierproxy.protocol.codecs import decode_response, encode_request

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from tierproxy.config import Config

    from ..metrics import ProxyMetrics
    from .chain import FilterChains

__all__ = ("ConnectionContext", "Forward", "NodeDirectory", "OwnCorrelationIds", "PerConnection", "ProxyServices")

S = TypeVar("S")

Forward = Callable[["Buffer | Sequence[Buffer]"], Awaitable[memoryview]]
"""Send a request frame body (header included) upstream on the client's connection;
get the broker's response payload (response header removed)."""


class NodeDirectory(Protocol):
    """Where broker nodes really are and where clients are told they are."""

    async def learn(self, node_id: int, host: str, port: int) -> tuple[str, int] | None:
        """Record a broker node's address, make sure its proxy listener is open, and
        return the (host, port) to advertise to clients for it; None when the
        configuration gives the node no listener (clients must not be told about it)."""
        ...

    def advertised(self, node_id: int) -> tuple[str, int] | None:
        """The proxy's (host, port) for a broker node; None when it has none."""
        ...


@dataclass(frozen=True, eq=False)
class ProxyServices:
    """What every connection of one proxy shares."""

    config: Config
    metrics: ProxyMetrics
    nodes: NodeDirectory
    filters: FilterChains


class OwnCorrelationIds:
    """Correlation ids of the proxy's own requests on a client's connection: -1, -2, ...
    so that in the broker's request log they never pass for one of the client's."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids = itertools.count(-1, -1)

    def next(self) -> int:
        correlation_id = next(self._ids)
        if correlation_id < -(2**31):  # int32 on the wire: start again at -1
            self._ids = itertools.count(-2, -1)
            return -1
        return correlation_id


@dataclass(eq=False, slots=True)
class ConnectionContext:
    """One client connection, as its filters see it."""

    peer: str
    """The client's address, `host:port`."""
    node_id: int | None
    """The broker node the client addressed; None on the bootstrap listener."""
    broker: tuple[str, int]
    """The broker address the upstream connection went to."""
    services: ProxyServices
    forward: Forward
    """The client's upstream connection (used by the end of every chain)."""
    broker_api_versions: dict[int, tuple[int, int]] = field(default_factory=dict)
    """The broker's {api key: (min, max)}, once the client asked ApiVersions on this
    connection (the ApiVersions filter fills it in)."""
    correlation_ids: OwnCorrelationIds = field(default_factory=OwnCorrelationIds)
    states: dict[PerConnection[Any], Any] = field(default_factory=dict)
    """Each `PerConnection`'s state of this connection, made on its first use."""

    async def send(self, request: Any, client_id: str | None) -> Any:
        """A kio request of the proxy's own on the client's upstream connection, so it runs
        with the client's identity; the kio response. The client id is the client's
        (its quotas apply), the correlation id the proxy's own."""
        payload = await self.forward(encode_request(request, self.correlation_ids.next(), client_id))
        return decode_response(request.__api_key__, request.__version__, payload)


class PerConnection(Generic[S]):
    """State that its owner (a filter, or what several filters share) keeps per client
    connection: `factory` makes a connection's own on its first use, and it goes when
    the connection does."""

    __slots__ = ("factory",)

    def __init__(self, factory: Callable[[ConnectionContext], S]) -> None:
        self.factory = factory

    def of(self, ctx: ConnectionContext) -> S:
        try:
            state: S = ctx.states[self]
        except KeyError:
            state = ctx.states[self] = self.factory(ctx)
        return state
