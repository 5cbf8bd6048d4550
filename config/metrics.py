"""What every metrics endpoint of tierproxy shares: the build-info family, the HTTP
endpoint itself, and no `_created` series.

Here, the lowest layer, because the proxy and the pipeline (`tierproxy tier --every`)
both serve metrics.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, Gauge, disable_created_metrics

__all__ = ("DISTRIBUTION", "metrics_endpoint", "register_build_info", "tierproxy_version")

DISTRIBUTION = "kafka-tierproxy"

# A counter's `_created` sample is a second series per label set that no rule or dashboard
# of ours reads; prometheus-client's switch is process-wide, so it is thrown once here,
# where every registry of tierproxy is built from.
disable_created_metrics()


def tierproxy_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # running from a source tree that was not installed
        return "unknown"


def register_build_info(registry: CollectorRegistry) -> Gauge:
    """`tierproxy_build_info{version}` = 1, as Prometheus' own `prometheus_build_info`."""
    info = Gauge("tierproxy_build_info", "Always 1; the version of tierproxy serving these metrics.", ["version"],
                 registry=registry, multiprocess_mode="max")
    info.labels(tierproxy_version()).set(1)
    return info


def metrics_endpoint(host: str, port: int, registry: CollectorRegistry,
                     ready: Callable[[], str | None] | None = None) -> WSGIServer:
    """The Prometheus HTTP endpoint (its server, to shut down), or OSError naming the address.

    With `ready` (None when ready, else why not), `/ready` answers 200, or 503 and the
    reason; every other path is prometheus-client's exposition, as `start_http_server`
    serves it. The server is built here rather than by `start_http_server` so that `/ready`
    exists from the first request on.
    """
    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    app = make_wsgi_app(registry)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
        http = server_class((host, port), _QuietHandler)
    except OSError as e:
        raise OSError(e.errno, f"cannot open the metrics endpoint on {host}:{port}: {e.strerror}") from e
    http.set_app(app if ready is None else _with_ready(app, ready))
    threading.Thread(target=http.serve_forever, name="metrics-endpoint", daemon=True).start()
    return http


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a line per scrape is noise
        pass


def _with_ready(app: Callable[..., Iterable[bytes]], ready: Callable[[], str | None]) -> Callable[..., Iterable[bytes]]:
    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/ready":
            return app(environ, start_response)
        reason = ready()
        start_response("200 OK" if reason is None else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8")])
        return [f"{reason or 'ready'}\n".encode()]
    return serve
