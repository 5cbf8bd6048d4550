"""What every metrics endpoint of tierproxy shares: the build-info family, the HTTP
endpoint itself, and no `_created` series.

Here, the lowest layer, because the proxy and the pipeline (`tierproxy tier --every`)
both serve metrics.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from wsgiref.simple_server import WSGIServer

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


def metrics_endpoint(host: str, port: int, registry: CollectorRegistry) -> WSGIServer:
    """The Prometheus HTTP endpoint (its server, to shut down), or OSError naming the address."""
    from prometheus_client import start_http_server

    try:
        http, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise OSError(e.errno, f"cannot open the metrics endpoint on {host}:{port}: {e.strerror}") from e
    return http
