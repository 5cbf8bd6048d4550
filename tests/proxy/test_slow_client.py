"""A client that stops reading a large remote replay holds back bounded memory, and the
proxy goes on serving other connections meanwhile.

The client pipelines Fetches of the remote part and reads nothing. The proxy answers
them until `max.pending.response.bytes.per.connection` are unsent, then stops reading
it; the chunks those responses send from stay leased to them, counted against
`remote.log.chunk.cache.size.bytes`, and go back when the connection closes."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest

from tierproxy.cache.chunk_cache import ChunkCache
from tierproxy.proxy.filters.fetch import FetchFilter
from tierproxy.proxy.paced import MIN_PIECE
from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.codecs import encode_request
from tierproxy.protocol.requests import fetch_request

from testbed.ports import tcp_sockets
from testbed.raw import frame, read_frames
from tests.helpers.consume import consume_aiokafka, expected_keys, record_key
from tests.helpers.fixtures import proxy_fixture, tiered_fixture
from tests.helpers.proxy import ProxyThread
from tests.helpers.tiered import Timed, TopicSpec
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(300)

CHUNK = 64 * 1024
BOUND = 24 * CHUNK
PENDING = 256 * 1024
FETCH_BYTES = 192 * 1024
# About 4 MB per partition, nearly all of it remote: many times the chunk cache's bound.
SPEC = TopicSpec(Timed(per_partition=4000, value_size=1000), partitions=1, fraction=0.95,
                 segment_bytes=512 * 1024)

tiered = tiered_fixture(SPEC)
proxy = proxy_fixture(**{
    "remote.log.chunk.size.bytes": CHUNK,
    "remote.log.chunk.cache.size.bytes": BOUND,
    "max.pending.response.bytes.per.connection": PENDING,
})


def _chunk_cache(proxy: ProxyThread) -> ChunkCache:
    assert proxy.server is not None
    (fetch,) = [f for f in proxy.server.services.filters.filters_of(ApiKey.FETCH) if isinstance(f, FetchFilter)]
    return fetch.tier.engine.chunk_cache


def _held(proxy: ProxyThread) -> tuple[int, int]:
    """(bytes responses hold, bytes counted against the bound), read on the proxy's loop."""
    cache = _chunk_cache(proxy)
    return proxy.call(lambda: (cache._held_by_responses(), cache.total_bytes))


def _pipelining(proxy: ProxyThread) -> set[str]:
    """The client addresses of the connections that pipeline Fetches, read on the proxy's loop."""
    assert proxy.server is not None
    connections = proxy.server._connections
    return proxy.call(lambda: {c.peer for c in connections if c.pipelining})


def _metric(proxy: ProxyThread, name: str) -> float:
    assert proxy.server is not None
    return proxy.server.services.metrics.value(name)


async def test_a_client_that_stops_reading_holds_bounded_memory_while_others_are_served(proxy, tiered):
    remote_end = tiered.boundary[0]
    # Fetches of consecutive stretches of the remote part, sent at once, never read.
    per_fetch = FETCH_BYTES // 1100
    requests = b"".join(
        frame(encode_request(fetch_request(tiered.topic, 0, offset, FETCH_BYTES), i + 1, "stuck"))
        for i, offset in enumerate(range(0, remote_end, per_fetch)))
    host, port = proxy.bootstrap_servers.rsplit(":", 1)
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect((host, int(port)))
    try:
        stuck.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 30
        while sent < len(requests) and time.monotonic() < deadline:  # as much as the proxy reads
            try:
                sent += stuck.send(requests[sent:])
            except BlockingIOError:
                await asyncio.sleep(0.05)
        # The proxy answered what it could and holds the chunks of the responses unsent.
        await wait_until(lambda: _held(proxy)[0] > 0, 30, "the stuck client's responses hold chunks")
        held, total = _held(proxy)
        assert held <= BOUND and total <= BOUND + CHUNK
        # Its Fetches wait behind the one in hand: it pipelines, and its reads come last.
        stuck_peer = "%s:%d" % stuck.getsockname()
        assert _pipelining(proxy) == {stuck_peer}

        peaks = []
        pipelining = set()

        async def watch() -> None:
            while True:
                peaks.append(_held(proxy))
                pipelining.update(_pipelining(proxy))
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        try:
            # Another client on another connection reads the whole topic meanwhile.
            consumed = await consume_aiokafka(proxy.bootstrap_servers, tiered.topic, len(tiered.records),
                                              isolation_level="read_uncommitted")
        finally:
            watcher.cancel()
        assert [record_key(r) for r in sorted(consumed, key=lambda r: r.offset)] == expected_keys(tiered.records)
        # One demand load in flight per connection may pass the bound by its chunk.
        assert peaks and all(held <= BOUND and total <= BOUND + 2 * CHUNK for held, total in peaks), peaks
        assert pipelining == {stuck_peer}  # a consumer keeps one Fetch in flight: it never pipelines
        assert _held(proxy)[0] > 0  # the stuck client still holds its responses' chunks
        # The metrics say what it costs: the chunk bytes it holds.
        await wait_until(lambda: _metric(proxy, "tierproxy_stalled_chunk_bytes") > 0, 10,
                         "the stalled client's chunk bytes are in the metrics")
        assert _metric(proxy, "tierproxy_stalled_chunk_bytes") <= BOUND + CHUNK
    finally:
        stuck.close()
    # Its connection closed: every lease went back.
    await wait_until(lambda: _held(proxy)[0] == 0, 30, "its leases went back")
    await wait_until(lambda: _metric(proxy, "tierproxy_stalled_chunk_bytes") == 0, 10, "no stalled client holds chunks")


def _unacked_bytes(local_port: int, remote_port: int) -> int:
    """Bytes the kernel holds unacknowledged on the connection from `local_port` to
    `remote_port`: what was handed to a socket and not yet taken into the peer's receive buffer."""
    for tcp in tcp_sockets():
        if tcp.local_port == local_port and tcp.remote_port == remote_port:
            return tcp.tx_queue
    raise AssertionError(f"no connection from port {local_port} to {remote_port}")


# Kafka's own default; the proxy's is the kernel's autotuning (-1).
SEND_BUFFER = 102_400


@pytest.fixture(scope="module")
def bounded_send_proxy(tiered):
    with tiered.proxy(**{"socket.send.buffer.bytes": SEND_BUFFER}) as proxy:
        yield proxy


async def test_a_client_that_never_reads_holds_a_send_buffer_in_the_kernel_not_its_response(bounded_send_proxy, tiered):
    # The kernel doubles SO_SNDBUF, and a pause may hand over one more piece. Left to
    # autotuning it took the whole response: megabytes per client that never reads.
    proxy = bounded_send_proxy
    bound = 2 * SEND_BUFFER + MIN_PIECE
    fetch_bytes = 1 << 20  # a whole segment of remote records (512 KiB) comes back
    host, port = proxy.bootstrap_servers.rsplit(":", 1)
    silent = socket.create_connection((host, int(port)))
    try:
        silent.sendall(frame(encode_request(fetch_request(tiered.topic, 0, 0, fetch_bytes), 7, "silent")))
        client_port = silent.getsockname()[1]
        await wait_until(lambda: _unacked_bytes(int(port), client_port) > 0, 30, "the proxy answers")
        await asyncio.sleep(1.0)  # what the kernel takes, it takes at once
        assert _unacked_bytes(int(port), client_port) <= bound
        # Nothing was lost: the rest waited in the proxy, and the whole response comes once read.
        (body,) = await asyncio.to_thread(read_frames, silent, 1, 30)
        assert struct.unpack_from(">i", body)[0] == 7
        assert len(body) > bound
    finally:
        silent.close()
