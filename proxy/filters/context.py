"""What a filter sees of the proxy and of one client connection.

Per-connection state is typed: each field belongs to the filters that fill it (the
broker's API versions to the ApiVersions filter, the tiered state to Fetch and
ListOffsets), and a connection's state is never seen by another connection.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tierproxy.protocol.codecs import decode_response, encode_request

from .tiered_state import TieredConnectionState

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from tierproxy.config import Config

    from ..metrics import ProxyMetrics
    from .chain import FilterChains

__all__ = ("ConnectionContext", "Forward", "NodeDirectory", "OwnCorrelationIds", "ProxyServices")

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
    tiered: TieredConnectionState = field(default_factory=TieredConnectionState)
    correlation_ids: OwnCorrelationIds = field(default_factory=OwnCorrelationIds)

    async def send(self, request: Any, client_id: str | None) -> Any:
        """A kio request of the proxy's own on the client's upstream connection, so it runs
        with the client's identity; the kio response. The client id is the client's
        (its quotas apply), the correlation id the proxy's own."""
        payload = await self.forward(encode_request(request, self.correlation_ids.next(), client_id))
        return decode_response(request.__api_key__, request.__version__, payload)
