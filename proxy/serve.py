"""The proxy as one running service: filters, listeners and the metrics endpoint,
until stopped. On stop the listeners close, every client connection is closed and the
filters are stopped."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal

from tierproxy.config import Config, METRICS_PORT, PROXY_LISTENER_HOST
from tierproxy.protocol.codecs import preload
from tierproxy.storage.shared_quota import SharedQuotaFile

from .filters import FilterChains
from .filters.addresses import BrokerAddressFilter
from .filters.api_versions import ApiVersionsFilter
from .filters.fetch import FetchFilter
from .filters.list_offsets import ListOffsetsFilter
from .filters.offset_for_leader_epoch import OffsetForLeaderEpochFilter
from .filters.replica import ReadReplicas, ReplicaProduceFilter
from .metrics import ProxyMetrics, metrics_endpoint
from .readiness import CHECK_INTERVAL_S, Readiness
from .server import ProxyServer

__all__ = ("build_filters", "serve")

log = logging.getLogger("tierproxy")


def build_filters(config: Config, metrics: ProxyMetrics, *, worker: bool = False,
                  shared_fetch_quota: SharedQuotaFile | None = None) -> FilterChains:
    """The proxy's filters in chain order; requests of other APIs pass through untouched.

    The address filter comes first, so it is the last to see a response: Fetch's, built
    from the broker and the remote tier, reaches it like any other. Fetch and ListOffsets
    share one remote tier, started and closed with the Fetch filter; its metrics join the
    proxy's registry. A `worker` shares the on-disk index cache with the other workers, and
    the fetch quota when it is given `shared_fetch_quota`.
    With read replica topics, Produce meets a filter that refuses writes to them, and
    OffsetForLeaderEpoch one that answers their epochs from the remote log.
    """
    from .tiered import RemoteTier

    tier = RemoteTier(config, registry=metrics.registry, shared_index_dir=worker,
                      shared_fetch_quota=shared_fetch_quota)
    replicas = ReadReplicas.of(tier)
    return FilterChains([
        BrokerAddressFilter(),
        ApiVersionsFilter(),
        *([ReplicaProduceFilter(replicas, tier.metrics)] if replicas else []),
        FetchFilter(tier),
        ListOffsetsFilter(tier),
        *([OffsetForLeaderEpochFilter(tier, replicas)] if replicas else []),
    ])


async def serve(config: Config, *, stop: asyncio.Event | None = None, worker: bool = False,
                shared_fetch_quota: SharedQuotaFile | None = None) -> None:
    """Serve until ``stop`` is set, or until SIGTERM/SIGINT when none is given. A `worker`
    (one of several processes, see proxy.workers) opens its listeners with SO_REUSEPORT."""
    loop = asyncio.get_running_loop()
    if stop is None:
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
    preload()  # the codecs of the intercepted APIs, before the first client needs them
    metrics = ProxyMetrics()
    server = ProxyServer(config, build_filters(config, metrics, worker=worker, shared_fetch_quota=shared_fetch_quota),
                         metrics, reuse_port=worker)
    # A worker tells its supervisor, whose metrics endpoint is the proxy's (proxy.workers).
    readiness = Readiness(os.environ.get("PROMETHEUS_MULTIPROC_DIR") if worker else None)
    http = None
    checks = None
    try:
        # The endpoint first: whoever sees the proxy listening can scrape it.
        if config[METRICS_PORT]:
            http = metrics_endpoint(config[PROXY_LISTENER_HOST], config[METRICS_PORT], metrics.registry,
                                    readiness.reason)
        await server.start()
        readiness.listening()
        checks = loop.create_task(_check_broker(server, readiness))
        log.info("tierproxy serving on %s, broker nodes %s", server.bootstrap_servers,
                 sorted(server.node_listeners) or "not known yet")
        # What start-up built (codecs, schemas, metadata) lives as long as the process: out of
        # the collector's way, so that its full collections walk only what serving allocates.
        gc.freeze()
        await stop.wait()
        log.info("shutting down")
    finally:
        readiness.closing()
        if checks is not None:
            checks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checks
        await server.close()
        if http is not None:
            http.shutdown()
            http.server_close()
    log.info("stopped")


async def _check_broker(server: ProxyServer, readiness: Readiness) -> None:
    """Ask a bootstrap broker every CHECK_INTERVAL_S, for `/ready`."""
    while True:
        readiness.broker_checked(await server.reach_broker())
        await asyncio.sleep(CHECK_INTERVAL_S)
