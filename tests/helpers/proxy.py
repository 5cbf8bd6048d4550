"""The proxy in a test: a ProxyServer on uvloop in a thread of its own, as `tierproxy serve`
runs it, so that blocking clients (confluent-kafka, kcat, the Java console consumer) and
aiokafka in the test's own event loop can all use it.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from tierproxy.config import Config, parse
from tierproxy.proxy.filters import Filter, FilterChains
from tierproxy.proxy.metrics import ProxyMetrics
from tierproxy.proxy.serve import build_filters
from tierproxy.proxy.server import ProxyServer
from testbed.ports import LOOPBACK


def free_port_block(count: int, attempts: int = 50) -> int:
    """A base port such that base .. base+count-1 are free now (the node listeners)."""
    for _ in range(attempts):
        base = random.randrange(20000, 60000 - count)
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((LOOPBACK, port))
                sockets.append(sock)
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no block of {count} free ports found")


def proxy_config(bootstrap: str, nodes: int = 3, **overrides: Any) -> Config:
    """Proxy settings on loopback: an ephemeral bootstrap port, node ports free now."""
    properties = {
        "bootstrap.servers": bootstrap,
        "proxy.listener.host": LOOPBACK,
        "proxy.bootstrap.port": "0",
        "proxy.broker.port.base": str(free_port_block(nodes)),
        "metrics.port": "0",
    }
    # Keys may be given as keyword-friendly names: socket_request_max_bytes.
    properties.update({key.replace("_", "."): str(value) for key, value in overrides.items()})
    return parse(properties)


class ProxyThread:
    """A ProxyServer on its own uvloop event loop in a background thread."""

    def __init__(self, config: Config, metrics: ProxyMetrics | None = None, *, discover: bool = True,
                 extra_filters: Sequence[Filter] = ()) -> None:
        self.config = config
        self.discover = discover
        self.extra_filters = tuple(extra_filters)  # after the proxy's own
        self.metrics = metrics if metrics is not None else ProxyMetrics()
        self.server: ProxyServer | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="tierproxy", daemon=True)

    def _run(self) -> None:
        import uvloop

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            filters = FilterChains([*build_filters(self.config, self.metrics), *self.extra_filters])
            server = ProxyServer(self.config, filters, self.metrics)
            try:
                await server.start(discover=self.discover)
                self.server = server
                self._ready.set()
                await self._stop.wait()
            finally:
                await server.close()

        try:
            uvloop.run(main())
        except BaseException as e:  # reported by start()
            self._error = e
        finally:
            self._ready.set()

    def start(self) -> ProxyThread:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None or self.server is None:
            raise RuntimeError("proxy did not start") from self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert not self._thread.is_alive(), "proxy thread did not stop"

    @property
    def bootstrap_servers(self) -> str:
        assert self.server is not None
        return self.server.bootstrap_servers

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the proxy's loop and return its result (thread-safe)."""
        assert self._loop is not None
        done: asyncio.Future = asyncio.run_coroutine_threadsafe(_call(fn, *args), self._loop)  # type: ignore[assignment]
        return done.result(30)


async def _call(fn: Any, *args: Any) -> Any:
    return fn(*args)


@contextmanager
def running(config: Config) -> Iterator[ProxyThread]:
    """A ProxyThread with this configuration, started, stopped on the way out."""
    proxy = ProxyThread(config).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def running_proxy(bootstrap: str, nodes: int = 3, **overrides: Any) -> AbstractContextManager[ProxyThread]:
    """`running(proxy_config(...))`."""
    return running(proxy_config(bootstrap, nodes, **overrides))
