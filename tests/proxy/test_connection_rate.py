"""`max.connection.creation.rate` (KIP-612): new connections over the rate wait, unread,
for their turn; connections already open go on being served meanwhile. The bucket on a
clock of its own, then real sockets through the proxy to the testbed broker."""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Iterator

import pytest

from tierproxy.proxy.connection_rate import ConnectionRate
from testbed.raw import api_versions, read_frames
from tests.helpers.proxy import ProxyThread, proxy_config

pytestmark = pytest.mark.timeout(120)

RATE = 4
NEW = 12


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_one_seconds_worth_passes_then_one_turn_every_one_over_the_rate() -> None:
    clock = Clock()
    rate = ConnectionRate(4, clock)
    assert [rate.delay() for _ in range(4)] == [0.0] * 4
    assert [rate.delay() for _ in range(3)] == [0.25, 0.5, 0.75]  # spread out, none refused
    clock.now += 0.5  # two turns came: the next waits behind the one still owed
    assert rate.delay() == pytest.approx(0.5)
    clock.now += 10  # the bucket refills to one second's worth, no more
    assert [rate.delay() for _ in range(5)] == [0.0, 0.0, 0.0, 0.0, 0.25]


def test_a_rate_below_one_per_second_still_lets_one_connection_through() -> None:
    clock = Clock()
    rate = ConnectionRate(0.5, clock)
    assert rate.delay() == 0.0
    assert rate.delay() == pytest.approx(2.0)
    with pytest.raises(ValueError):
        ConnectionRate(0)


@pytest.fixture
def throttled_proxy(kafka_cluster) -> Iterator[ProxyThread]:
    thread = ProxyThread(proxy_config(kafka_cluster.bootstrap_servers, 1, **{
        "max.connection.creation.rate": RATE})).start()
    try:
        yield thread
    finally:
        thread.stop()


def test_new_connections_over_the_rate_wait_and_open_ones_are_served_meanwhile(throttled_proxy):
    host, port = throttled_proxy.bootstrap_servers.rsplit(":", 1)
    to = (host, int(port))
    time.sleep(1.5)  # the bucket is full again after the proxy's own start
    open_one = socket.create_connection(to)
    new: list[socket.socket] = []
    try:
        open_one.sendall(api_versions(1))
        assert read_frames(open_one, 1)
        started = time.monotonic()
        new = [socket.create_connection(to) for _ in range(NEW)]
        for i, sock in enumerate(new):
            sock.sendall(api_versions(100 + i))
        # Each new connection's answer, as it comes; the open connection asks on meanwhile.
        answered: dict[int, float] = {}
        open_answers: list[float] = []
        selector = selectors.DefaultSelector()
        for i, sock in enumerate(new):
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ, i)
        while len(answered) < NEW and time.monotonic() - started < 30:
            for key, _ in selector.select(0.05):
                if key.fileobj.recv(1 << 16):  # type: ignore[union-attr]  # a socket
                    answered.setdefault(key.data, time.monotonic() - started)
                    selector.unregister(key.fileobj)
            if len(open_answers) < 5:
                open_one.sendall(api_versions(2))
                assert read_frames(open_one, 1)
                open_answers.append(time.monotonic() - started)
        selector.close()
        assert len(answered) == NEW, f"answered: {sorted(answered)}"
        last = max(answered.values())
        # NEW - RATE connections over a bucket of RATE take a turn each, 1/RATE s apart.
        assert last >= (NEW - RATE) / RATE * 0.8, sorted(answered.values())
        # The open connection was never held behind them.
        assert len(open_answers) == 5 and open_answers[-1] < last, (open_answers, last)
    finally:
        open_one.close()
        for sock in new:
            sock.close()
    metrics = throttled_proxy.metrics
    assert metrics.value("tierproxy_connections_throttled_total") >= NEW - RATE - 1
    assert metrics.value("tierproxy_connection_throttle_seconds_total") > 0
