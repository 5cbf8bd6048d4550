"""Connections that close inside a large frame leave nothing behind: no authentication is
needed to announce a frame up to `socket.request.max.bytes` on a plaintext listener, so
the bytes received of it must go when the connection goes, not when Python's cyclic
collector happens to run."""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.ports import LOOPBACK, free_ports
from testbed.raw import api_versions, read_frames
from tests.helpers.proxy import free_port_block
from tests.helpers.serve import Served, sample, scrape, start_serving
from tests.helpers.wait import wait_for

MIB = 1024 * 1024
ANNOUNCED = 100 * MIB
SENT = 20 * MIB
CONNECTIONS = 10
ROUNDS = 3
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def served(kafka_cluster, tmp_path_factory) -> Iterator[tuple[Served, int, int]]:
    """`tierproxy serve` with one worker (its memory is the proxy's) on a plaintext listener."""
    bootstrap_port, metrics_port = free_ports(2)
    directory = tmp_path_factory.mktemp("partial-frames")
    proxy = start_serving({
        "bootstrap.servers": kafka_cluster.bootstrap_servers, "proxy.listener.host": LOOPBACK,
        "proxy.bootstrap.port": bootstrap_port, "proxy.broker.port.base": free_port_block(1),
        "metrics.port": metrics_port, "proxy.workers": 1,
        "remote.log.storage.local.dir": directory / "remote", "remote.log.metadata.dir": directory / "metadata",
    }, directory)
    try:
        proxy.wait_for("tierproxy serving on")
        yield proxy, bootstrap_port, metrics_port
    finally:
        assert proxy.stop() == 0, proxy.output


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) / 1024


def _part_of_a_frame(address: tuple[str, int]) -> None:
    """A frame announcing ANNOUNCED bytes, SENT of them, then the connection closes."""
    with socket.create_connection(address) as sock:
        sock.sendall(api_versions(1))
        read_frames(sock, 1)
        sock.sendall(struct.pack(">i", ANNOUNCED) + b"\x01" * SENT)


def test_memory_of_a_frame_cut_short_goes_with_its_connection(served):
    proxy, bootstrap_port, metrics_port = served
    pid = proxy.process.pid
    _part_of_a_frame((LOOPBACK, bootstrap_port))  # the first connection's one-time costs
    proxy.wait_for("closing: bad frame at end of stream", 1)
    baseline = _rss_mib(pid)
    rounds = []
    for round_ in range(1, ROUNDS + 1):
        for _ in range(CONNECTIONS):
            _part_of_a_frame((LOOPBACK, bootstrap_port))
        proxy.wait_for("closing: bad frame at end of stream", 1 + round_ * CONNECTIONS)
        rounds.append(_rss_mib(pid))
    wait_for(lambda: sample(scrape(metrics_port), "tierproxy_connections_active") == 0, 30, "no connection active")
    # Kept, the frames would add up to CONNECTIONS x SENT (200 MiB) a round. Freed, the
    # allocator may keep a frame's worth or two for reuse (glibc raises its mmap threshold
    # to a freed block's size), but nothing grows from round to round.
    assert rounds[0] - baseline < 2 * SENT / MIB, (baseline, rounds)
    assert max(rounds) - rounds[0] < SENT / 2 / MIB, (baseline, rounds)
