"""The proxy's listeners: one bootstrap port, and one port per broker node.

Clients bootstrap on ``proxy.bootstrap.port``; the addresses in the responses they
get name node N by the host and port the configuration gives it (`config.broker_ports`:
a port map, a node-id range, or ``proxy.broker.port.base`` + N; a host pattern or one
advertised host). The proxy learns the nodes from Metadata (its own query at start-up,
then every response that names brokers) and opens a node's listener before any client
is told about it. A node the configuration gives no port is never named to clients
(logged once as an error). Each accepted client gets its own ClientConnection and
broker connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from collections.abc import Callable
from typing import Any

from tierproxy.client.connection import KafkaConnection, KafkaConnectionError
from tierproxy.client.security import security
from tierproxy.config import (
    Config,
    BOOTSTRAP_SERVERS,
    BROKER_CONNECTION_SETUP_TIMEOUT_MS,
    CONNECTIONS_MAX_IDLE_MS,
    MAX_CONNECTION_CREATION_RATE,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP,
    PROXY_BOOTSTRAP_PORT,
    PROXY_LISTENER_HOST,
    PROXY_SSL_CERTIFICATE_LOCATION,
    REQUEST_RECEIVE_TIMEOUT_MS,
)
from tierproxy.config.addresses import parse_host_port
from tierproxy.config.broker_ports import NodePorts, advertised_host
from tierproxy.protocol.errors import ProtocolError
from tierproxy.protocol.requests import metadata_request

from .authentication import UpstreamListener
from .client_connection import ClientConnection
from .connection_rate import ConnectionRate
from .filters import FilterChains, ProxyServices
from .metrics import ProxyMetrics
from .paced import copied_for_stalled, stalled_chunk_bytes
from .tls import CertificateNames, listener_ssl_context

__all__ = ("ProxyServer",)

log = logging.getLogger(__name__)


class ProxyServer:
    """Listeners, the broker node directory, and the open client connections."""

    def __init__(self, config: Config, filters: FilterChains | None = None,
                 metrics: ProxyMetrics | None = None, *, reuse_port: bool = False) -> None:
        self.config = config
        # Several worker processes listen on the same ports; alone, a taken port is an error.
        self._reuse_port = reuse_port
        self.services = ProxyServices(
            config=config,
            metrics=metrics if metrics is not None else ProxyMetrics(),
            nodes=self,
            filters=filters if filters is not None else FilterChains(),
        )
        self._listener_ssl = listener_ssl_context(config)
        self._certificate_names = CertificateNames.of(config)
        self._names_checked: set[str] = set()
        # The proxy's own connections authenticate as tierproxy; a client's upstream
        # connection gets only the TLS part, and the client brings its own SASL.
        self._security = security(config)
        self._broker_ssl = self._security.ssl_context
        # Whether the brokers' listener wants SASL, as far as the proxy knows (its own
        # broker query, without a login unless security.protocol has one, tells first).
        self.upstream = UpstreamListener(config, probe=self._ask_brokers)
        self._host: str = config[PROXY_LISTENER_HOST]
        self._node_ports = NodePorts.of(config)
        self._without_port: set[int] = set()  # nodes already logged as having no port
        self._connect_timeout = config[BROKER_CONNECTION_SETUP_TIMEOUT_MS] / 1000
        self._bootstrap = [parse_host_port(a) for a in config[BOOTSTRAP_SERVERS]]
        self._next_bootstrap = 0
        self._brokers: dict[int, tuple[str, int]] = {}
        self._servers: dict[int | None, asyncio.Server] = {}
        self._listen_lock = asyncio.Lock()
        self._connections: set[ClientConnection] = set()
        self._per_ip: dict[str, int] = {}
        self._max_connections: int = config[MAX_CONNECTIONS]
        self._max_connections_per_ip: int = config[MAX_CONNECTIONS_PER_IP]
        self._creation_rate = ConnectionRate(config[MAX_CONNECTION_CREATION_RATE])
        self._idle_s = config[CONNECTIONS_MAX_IDLE_MS] / 1000
        self._receive_s = config[REQUEST_RECEIVE_TIMEOUT_MS] / 1000
        self._reaper: asyncio.Task[None] | None = None
        self._started = False

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self, *, discover: bool = True) -> None:
        """Start the filters and the bootstrap listener; with ``discover``, also ask a
        broker for the cluster's nodes and open their listeners."""
        try:
            await self.services.filters.start()
        except BaseException:
            # What the filters opened before the failure (an object store's client) is
            # closed; the start's own error is the one to report.
            with contextlib.suppress(Exception):
                await self.services.filters.close()
            raise
        self._started = True
        self._reaper = asyncio.get_running_loop().create_task(self._reap())
        self._servers[None] = await self._listen(None, self.config[PROXY_BOOTSTRAP_PORT])
        self._check_certificate_names(self.bootstrap_address[0], "the bootstrap listener")
        if discover:
            await self._discover()

    async def close(self) -> None:
        servers = list(self._servers.values())
        self._servers.clear()
        for server in servers:
            server.close()
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for connection in list(self._connections):
            connection.close("the proxy is shutting down", flush=True)
        for server in servers:
            await server.wait_closed()
        await self.upstream.close()
        if self._started:
            self._started = False
            await self.services.filters.close()

    async def __aenter__(self) -> ProxyServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- addresses ---------------------------------------------------------------------

    @property
    def bootstrap_address(self) -> tuple[str, int]:
        """(host, port) clients bootstrap on."""
        return advertised_host(self.config, None), self._bound_port(None)

    @property
    def bootstrap_servers(self) -> str:
        host, port = self.bootstrap_address
        return f"{host}:{port}"

    @property
    def brokers(self) -> dict[int, tuple[str, int]]:
        """Broker node id -> the broker's own (host, port), as learned."""
        return dict(self._brokers)

    @property
    def node_listeners(self) -> dict[int, tuple[str, int]]:
        """Broker node id -> the (host, port) advertised for it, for every open node listener."""
        return {node_id: (advertised_host(self.config, node_id), self._bound_port(node_id))
                for node_id in self._servers if node_id is not None}

    def advertised(self, node_id: int) -> tuple[str, int] | None:
        """The (host, port) clients are told for a broker node; None when it has no port."""
        port = self._node_ports.port(node_id)
        return None if port is None else (advertised_host(self.config, node_id), port)

    async def learn(self, node_id: int, host: str, port: int) -> tuple[str, int] | None:
        if self._brokers.get(node_id) != (host, port):
            if node_id in self._brokers:
                log.info("broker node %d moved from %s:%d to %s:%d", node_id, *self._brokers[node_id], host, port)
            self._brokers[node_id] = (host, port)
        advertised = self.advertised(node_id)
        if advertised is None:
            if node_id not in self._without_port:
                self._without_port.add(node_id)
                log.error("broker node %d (%s:%d) has no proxy port in %s: clients are not told about it, so "
                          "partitions it leads have no leader for them and groups it coordinates none; give it "
                          "a port and restart the proxy", node_id, host, port, self._node_ports.describe())
            return None
        if node_id not in self._servers:
            async with self._listen_lock:
                if node_id not in self._servers and self._started:
                    self._servers[node_id] = await self._listen(node_id, advertised[1])
                    self._check_certificate_names(advertised[0], f"broker node {node_id}")
        return advertised

    def upstream_addresses(self, node_id: int | None) -> list[tuple[str, int]]:
        """Where a client of this listener is connected: node N, or any bootstrap broker
        (each connection starts at the next one, so one dead broker does not stick)."""
        if node_id is not None:
            address = self._brokers.get(node_id)
            return [address] if address is not None else []
        start = self._next_bootstrap
        self._next_bootstrap = (start + 1) % len(self._bootstrap)
        return self._bootstrap[start:] + self._bootstrap[:start]

    async def open_upstream(self, factory: Callable[[], Any], host: str, port: int) -> tuple[Any, Any]:
        loop = asyncio.get_running_loop()
        server_hostname = host if self._broker_ssl is not None else None
        return await asyncio.wait_for(
            loop.create_connection(factory, host, port, ssl=self._broker_ssl, server_hostname=server_hostname),
            self._connect_timeout,
        )

    # --- connections -------------------------------------------------------------------

    def connection_opened(self, connection: ClientConnection) -> str | None:
        """Admit a new client connection, or name the limit (max.connections,
        max.connections.per.ip) that refuses it."""
        if len(self._connections) >= self._max_connections:
            return "max.connections"
        per_ip = self._per_ip.get(connection.ip, 0)
        if per_ip >= self._max_connections_per_ip:
            return "max.connections.per.ip"
        self._per_ip[connection.ip] = per_ip + 1
        self._connections.add(connection)
        return None

    def connection_delay(self) -> float:
        """Seconds a connection admitted now waits, unread, for its turn under
        max.connection.creation.rate (0: none)."""
        delay = self._creation_rate.delay()
        if delay:
            self.services.metrics.connections_throttled.inc()
            self.services.metrics.connection_throttle_seconds.inc(delay)
        return delay

    def connection_closed(self, connection: ClientConnection) -> None:
        if connection in self._connections:
            self._connections.remove(connection)
            left = self._per_ip[connection.ip] - 1
            if left:
                self._per_ip[connection.ip] = left
            else:
                del self._per_ip[connection.ip]

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    # --- internals ---------------------------------------------------------------------

    async def _reap(self) -> None:
        """Close idle connections and ones stuck inside a frame, a few times per timeout;
        bring the metrics of stalled clients up to date meanwhile."""
        tick = min(1.0, self._idle_s / 4, self._receive_s / 4)
        copied = copied_for_stalled()
        metrics = self.services.metrics
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for connection in list(self._connections):
                connection.check_timeouts(now, self._idle_s, self._receive_s)
            metrics.stalled_chunk_bytes.set(stalled_chunk_bytes())
            copied, before = copied_for_stalled(), copied
            metrics.stalled_chunk_bytes_copied.inc(copied - before)

    def _check_certificate_names(self, host: str, listener: str) -> None:
        """Warn once per host about a name the listeners' certificate does not cover:
        clients that check host names (the default) would refuse the connection."""
        names = self._certificate_names
        if names is None or host in self._names_checked:
            return
        self._names_checked.add(host)
        if not names.covers(host):
            log.warning("proxy.ssl.certificate.location=%s does not name %s, the host clients are told for %s "
                        "(its names: %s): clients that check host names will refuse it",
                        self.config[PROXY_SSL_CERTIFICATE_LOCATION], host, listener, names)

    def _bound_port(self, node_id: int | None) -> int:
        return self._servers[node_id].sockets[0].getsockname()[1]

    async def _listen(self, node_id: int | None, port: int) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        name = "bootstrap" if node_id is None else f"broker node {node_id}"
        try:
            server = await loop.create_server(
                lambda: ClientConnection(self, node_id), self._host, port,
                ssl=self._listener_ssl, reuse_address=True, reuse_port=self._reuse_port or None,
                start_serving=True)
        except OSError as e:
            raise OSError(e.errno, f"cannot open the {name} listener on {self._host}:{port}: {e.strerror}") from e
        log.info("listening for %s on %s:%d%s", name, self._host, server.sockets[0].getsockname()[1],
                 " (TLS)" if self._listener_ssl is not None else "")
        return server

    async def _discover(self) -> None:
        """Open every node's listener up front, so clients holding metadata from before a
        restart can reconnect. Asked with tierproxy's own credentials (security.protocol,
        sasl.*); best effort: without them a SASL broker refuses, and then the nodes are
        learned from the clients' own Metadata."""
        response = await self._ask_brokers()
        for broker in response.brokers if response is not None else ():
            await self.learn(broker.node_id, broker.host, broker.port)

    async def reach_broker(self) -> str | None:
        """None when a bootstrap broker answers ApiVersions (and the login, with
        security.protocol's own), else why none does: the readiness check."""
        failures = []
        for host, port in self._bootstrap:
            try:
                connection = await KafkaConnection.open(host, port, security=self._security, client_id="tierproxy",
                                                        timeout=self._connect_timeout)
            except (OSError, asyncio.TimeoutError, ProtocolError, KafkaConnectionError) as e:
                failures.append(str(e) or type(e).__name__)
                continue
            await connection.close()
            return None
        return f"no bootstrap broker answers: {'; '.join(failures)}"

    async def _ask_brokers(self) -> Any:
        """Metadata (no topics) from the first bootstrap broker that answers; None if none
        does. Without a login of its own (security.protocol) the proxy learns from it
        whether the listener wants SASL: a broker that answered ApiVersions, then closed the
        connection on Metadata, does."""
        for host, port in self._bootstrap:
            try:
                async with await KafkaConnection.open(host, port, security=self._security, client_id="tierproxy",
                                                      timeout=self._connect_timeout) as connection:
                    try:
                        response = await connection.request(metadata_request(()), timeout=self._connect_timeout)
                    except KafkaConnectionError:
                        self.upstream.learned(needs_sasl=True, how=f"{host}:{port} refused Metadata without a login")
                        raise
            except (OSError, asyncio.TimeoutError, ProtocolError, KafkaConnectionError) as e:
                log.info("no broker list from %s:%d (%s); learning nodes from client traffic", host, port, e)
                continue
            if not self._security.sasl:
                self.upstream.learned(needs_sasl=False, how=f"{host}:{port} answered Metadata without a login")
            return response
        return None
