"""`/ready` on the metrics endpoint of a real `tierproxy serve`, alone and with workers: 200
once the listeners are open and a broker answers; 503 and the reason before the listeners
are open and while no broker answers; `/metrics` as prometheus-client serves it."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from testbed.ports import LOOPBACK, free_ports
from tests.helpers.commands import wait_listening
from tests.helpers.proxy import free_port_block
from tests.helpers.serve import Served, sample, scrape, start_serving
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.timeout(180)


def get(metrics_port: int, path: str) -> tuple[int, str, str]:
    """(status, content type, body) of GET `path`, whatever the status."""
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{metrics_port}{path}", timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def serve(bootstrap_servers: str, tmp_path: Path, workers: int, **extra: object) -> tuple[Served, int, int]:
    bootstrap_port, metrics_port = free_ports(2)
    settings = {"bootstrap.servers": bootstrap_servers, "proxy.bootstrap.port": bootstrap_port,
                "proxy.broker.port.base": free_port_block(1), "metrics.port": metrics_port,
                "proxy.workers": workers, "remote.log.storage.local.dir": tmp_path / "remote",
                "remote.log.metadata.dir": tmp_path / "metadata", **extra}
    return start_serving(settings, tmp_path), bootstrap_port, metrics_port


def wait_for_ready(served: Served, metrics_port: int, want: str, seen: list[tuple[int, str]]) -> tuple[int, str]:
    """The first (status, body) of `/ready` whose body holds `want`; every answer on the way in `seen`."""

    def answered() -> bool:
        assert served.process.poll() is None, served.output
        try:
            status, _, body = get(metrics_port, "/ready")
        except OSError:  # the endpoint is not open yet
            return False
        seen.append((status, body))
        return want in body

    wait_for(answered, 90, f"/ready answering {want!r}")
    return seen[-1]


@pytest.mark.parametrize("workers", [1, 2])
def test_ready_once_serving_and_metrics_unchanged(kafka_cluster, tmp_path, workers):
    served, bootstrap_port, metrics_port = serve(kafka_cluster.bootstrap_servers, tmp_path, workers)
    try:
        seen: list[tuple[int, str]] = []
        assert wait_for_ready(served, metrics_port, "ready\n", seen) == (200, "ready\n")
        assert all(status == 503 for status, _ in seen[:-1]), seen
        socket.create_connection((LOOPBACK, bootstrap_port), timeout=10).close()
        status, content_type, body = get(metrics_port, "/metrics")
        assert (status, content_type) == (200, CONTENT_TYPE_PLAIN_0_0_4)
        assert sample(body, "tierproxy_build_info") == 1
        assert "tierproxy_client_bytes_in_total" in body and "# TYPE tierproxy_build_info gauge" in scrape(metrics_port)
    finally:
        assert served.stop() == 0, served.output


@pytest.mark.parametrize("workers", [1, 2])
def test_not_ready_while_no_broker_answers(tmp_path, workers):
    closed, = free_ports(1)
    served, bootstrap_port, metrics_port = serve(f"{LOOPBACK}:{closed}", tmp_path, workers)
    try:
        wait_listening(bootstrap_port, served.process)
        seen: list[tuple[int, str]] = []
        status, body = wait_for_ready(served, metrics_port, "no bootstrap broker answers", seen)
        assert status == 503
        assert f"no bootstrap broker answers: cannot connect to broker {LOOPBACK}:{closed}" in body, body
        assert body.count("\n") == 1 and body.startswith("worker 0: " if workers > 1 else "no bootstrap"), body
        assert all(status == 503 for status, _ in seen), seen
        assert get(metrics_port, "/metrics")[0] == 200
    finally:
        assert served.stop() == 0, served.output


def test_not_ready_before_the_listeners_are_open(tmp_path):
    """A broker that takes connections and never answers holds the start-up's node discovery
    (broker.connection.setup.timeout.ms): the metrics endpoint is open, the proxy not ready."""
    with socket.create_server((LOOPBACK, 0)) as silent:
        address = f"{LOOPBACK}:{silent.getsockname()[1]}"
        served, _, metrics_port = serve(address, tmp_path, 1, **{"broker.connection.setup.timeout.ms": 20_000})
        try:
            assert wait_for_ready(served, metrics_port, "not open", []) == (503, "the listeners are not open yet\n")
            assert get(metrics_port, "/metrics")[0] == 200
        finally:
            assert served.stop() == 0, served.output
