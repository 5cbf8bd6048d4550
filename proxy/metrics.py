"""The proxy's Prometheus metrics, all in one registry object.

Each ProxyServer is handed a ProxyMetrics; tests build a fresh one so that counts
from one test never leak into another. Hot-path counters are resolved per label
once and cached, so counting a forwarded request costs one dictionary lookup.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from tierproxy.config.metrics import metrics_endpoint, register_build_info
from tierproxy.protocol.apis import ApiKey

__all__ = ("ProxyMetrics", "api_name", "metrics_endpoint")


def api_name(api_key: int) -> str:
    """Kafka's name of an API key (`FETCH`), or `UNKNOWN_<key>` for one kio does not know."""
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"UNKNOWN_{api_key}"


class ProxyMetrics:
    """Connection counts and pass-through counters of one proxy."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.build_info = register_build_info(self.registry)
        self.connections_active = Gauge(
            "tierproxy_connections_active", "Client connections open now, by listener.",
            ["listener"], registry=self.registry, multiprocess_mode="livesum")
        self.connections = Counter(
            "tierproxy_connections", "Client connections accepted, by listener.",
            ["listener"], registry=self.registry)
        self.connections_closed = Counter(
            "tierproxy_connections_closed", "Client connections closed, by reason.",
            ["reason"], registry=self.registry)
        self.connections_rejected = Counter(
            "tierproxy_connections_rejected", "Client connections closed on accept, by the limit reached "
            "(max.connections, max.connections.per.ip).", ["limit"], registry=self.registry)
        self.connections_throttled = Counter(
            "tierproxy_connections_throttled", "New client connections that waited for their turn under "
            "max.connection.creation.rate before anything was read from them.", registry=self.registry)
        self.connection_throttle_seconds = Counter(
            "tierproxy_connection_throttle_seconds", "Seconds new client connections waited under "
            "max.connection.creation.rate, all together (Kafka's connection-accept-throttle-time).",
            registry=self.registry)
        self.requests_forwarded = Counter(
            "tierproxy_requests_forwarded", "Client requests forwarded to a broker unchanged, by API.",
            ["api"], registry=self.registry)
        self.requests_intercepted = Counter(
            "tierproxy_requests_intercepted", "Client requests handled by an interceptor, by API.",
            ["api"], registry=self.registry)
        self.client_bytes_in = Counter(
            "tierproxy_client_bytes_in", "Bytes received from clients.", registry=self.registry)
        self.client_bytes_out = Counter(
            "tierproxy_client_bytes_out", "Bytes sent to clients.", registry=self.registry)
        self.stalled_chunk_bytes = Gauge(
            "tierproxy_stalled_chunk_bytes", "Bytes of remote chunks held by the responses of clients that "
            "stopped reading (their socket took nothing for a while), counted against "
            "remote.log.chunk.cache.size.bytes.", registry=self.registry, multiprocess_mode="livesum")
        self.stalled_chunk_bytes_copied = Counter(
            "tierproxy_stalled_chunk_bytes_copied", "Bytes copied for clients whose socket was full: "
            "pieces the transport keeps for them and chunk slices copied out so that their chunks "
            "could go back to the cache.", registry=self.registry)
        self._forwarded: dict[int, Counter] = {}
        self._intercepted: dict[int, Counter] = {}

    def forwarded(self, api_key: int) -> None:
        child = self._forwarded.get(api_key)
        if child is None:
            child = self._forwarded[api_key] = self.requests_forwarded.labels(api_name(api_key))
        child.inc()

    def intercepted(self, api_key: int) -> None:
        child = self._intercepted.get(api_key)
        if child is None:
            child = self._intercepted[api_key] = self.requests_intercepted.labels(api_name(api_key))
        child.inc()

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (0 if never set): for tests and the demo summary."""
        return self.registry.get_sample_value(name, labels or {}) or 0.0
