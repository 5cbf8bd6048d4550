"""`tierproxy serve`: run the proxy on uvloop until SIGTERM or SIGINT.

Start-up fails with a message naming the key when the configuration is wrong, or
naming the address when a listener cannot be opened. On a signal the listeners
close, every client connection is closed, the interceptors are stopped and the
command exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from .config import Config, ConfigError, load
from .handlers import InterceptorRegistry
from .handlers.addresses import address_rewriters
from .handlers.api_versions import ApiVersionsInterceptor
from .handlers.fetch import FetchInterceptor
from .handlers.list_offsets import ListOffsetsInterceptor
from .metrics import ProxyMetrics
from .server import ProxyServer

__all__ = ("build_interceptors", "run", "serve")

log = logging.getLogger("tierproxy")


def build_interceptors(config: Config, metrics: ProxyMetrics) -> InterceptorRegistry:
    """Every API the proxy intercepts; everything else passes through untouched.

    The Fetch handler rewrites node endpoints itself. Fetch and ListOffsets share one
    remote tier, started and closed with the Fetch handler; its metrics join the
    proxy's registry.
    """
    from .tiered import RemoteTier

    tier = RemoteTier(config, registry=metrics.registry)
    return InterceptorRegistry([
        ApiVersionsInterceptor(),
        *address_rewriters(fetch=False),
        FetchInterceptor(tier),
        ListOffsetsInterceptor(tier),
    ])


async def serve(config: Config, *, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set, or until SIGTERM/SIGINT when none is given."""
    loop = asyncio.get_running_loop()
    if stop is None:
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
    metrics = ProxyMetrics()
    server = ProxyServer(config, build_interceptors(config, metrics), metrics)
    http = None
    try:
        await server.start()
        if config["metrics.port"]:
            from prometheus_client import start_http_server

            http, _ = start_http_server(config["metrics.port"], addr=config["proxy.listener.host"],
                                        registry=metrics.registry)
        log.info("tierproxy serving on %s, broker nodes %s", server.bootstrap_servers,
                 sorted(server.node_listeners) or "not known yet")
        await stop.wait()
        log.info("shutting down")
    finally:
        await server.close()
        if http is not None:
            http.shutdown()
            http.server_close()
    log.info("stopped")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        config = load(args.config, args.override)
    except ConfigError as e:
        print(f"tierproxy serve: {e}", file=sys.stderr)
        return 2
    import uvloop

    try:
        uvloop.run(serve(config))
    except (ConfigError, OSError) as e:
        print(f"tierproxy serve: {e}", file=sys.stderr)
        return 1
    return 0
