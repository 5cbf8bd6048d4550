"""Bad input closes only the connection that sent it, with a log line naming the peer
and the reason; a well-behaved client of the same proxy keeps being served.

Each test runs the same code on asyncio's and on uvloop's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from kio.schema.metadata.v12.request import MetadataRequest

from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.framing import encode_frame
from tierproxy.protocol.headers import encode_request_header
from tierproxy.client.connection import KafkaConnection
from tierproxy.proxy.metrics import ProxyMetrics
from tierproxy.config.addresses import parse_host_port
from tierproxy.proxy.server import ProxyServer
from tierproxy.proxy.serve import build_filters
from testbed.ports import free_port
from tests.helpers.proxy import proxy_config

RUNNERS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
MAX_REQUEST = 64 * 1024

BAD_INPUTS = {
    # An HTTP request: its first four bytes read as a 1.2 GB frame size.
    "garbage": (b"GET / HTTP/1.1\r\nHost: kafka\r\n\r\n", "exceeds the maximum"),
    "negative size": (b"\xff\xff\xff\xfe" + b"x" * 8, "negative frame size -2"),
    "oversized size prefix": ((MAX_REQUEST + 1).to_bytes(4, "big") + b"x" * 100, f"frame size {MAX_REQUEST + 1}"),
    "too short for a header": (b"\x00\x00\x00\x03abc", "request header needs"),
}


async def _metadata_ok(bootstrap: str) -> None:
    host, port = parse_host_port(bootstrap)
    async with await KafkaConnection.open(host, port) as connection:
        response = await connection.request(
            MetadataRequest(topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        assert response.brokers


async def _closed_by_proxy(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 10) == b""
    except ConnectionResetError:  # the proxy aborts: the kernel answers with a reset
        return True


def _with_proxy(run: Callable[[Coroutine[Any, Any, None]], None], bootstrap: str,
                body: Callable[[ProxyServer], Coroutine[Any, Any, None]], **overrides: Any) -> ProxyMetrics:
    metrics = ProxyMetrics()

    async def main() -> None:
        config = proxy_config(bootstrap, 1, **overrides)
        async with ProxyServer(config, build_filters(config, metrics), metrics) as server:
            await body(server)

    run(main())
    return metrics


@RUNNERS
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_frame_closes_only_its_connection(run, case, bootstrap_servers, caplog):
    data, reason = BAD_INPUTS[case]
    peers: list[str] = []

    async def body(server: ProxyServer) -> None:
        host, port = parse_host_port(server.bootstrap_servers)
        good = await KafkaConnection.open(host, port)
        async with good:
            reader, writer = await asyncio.open_connection(host, port)
            local = writer.get_extra_info("sockname")
            peers.append(f"{local[0]}:{local[1]}")
            writer.write(data)
            assert await _closed_by_proxy(reader)
            writer.close()
            # The connection opened before and a new one both still work.
            await good.request(MetadataRequest(topics=(), allow_auto_topic_creation=False,
                                               include_topic_authorized_operations=False))
            await _metadata_ok(server.bootstrap_servers)

    with caplog.at_level(logging.WARNING, logger="tierproxy.proxy"):
        metrics = _with_proxy(run, bootstrap_servers, body, socket_request_max_bytes=MAX_REQUEST)
    lines = [r.getMessage() for r in caplog.records if peers[0] in r.getMessage()]
    assert lines and reason in lines[0], [r.getMessage() for r in caplog.records]
    assert metrics.value("tierproxy_connections_closed_total", {"reason": "bad_request"}) == 1


@RUNNERS
def test_truncated_frame_at_eof_is_logged(run, bootstrap_servers, caplog):
    peers: list[str] = []

    async def body(server: ProxyServer) -> None:
        host, port = parse_host_port(server.bootstrap_servers)
        reader, writer = await asyncio.open_connection(host, port)
        local = writer.get_extra_info("sockname")
        peers.append(f"{local[0]}:{local[1]}")
        header = encode_request_header(ApiKey.METADATA, 12, 1, "truncated", 2)
        frame = b"".join(encode_frame(header, b"\x01\x00\x00\x00"))
        writer.write(frame[:-3])  # the peer goes away inside the frame
        writer.write_eof()
        assert await _closed_by_proxy(reader)
        writer.close()
        await _metadata_ok(server.bootstrap_servers)

    with caplog.at_level(logging.WARNING, logger="tierproxy.proxy"):
        _with_proxy(run, bootstrap_servers, body)
    lines = [r.getMessage() for r in caplog.records if peers[0] in r.getMessage()]
    assert lines and "truncated frame" in lines[0], [r.getMessage() for r in caplog.records]


@RUNNERS
def test_unknown_api_key_is_forwarded_opaquely(run, bootstrap_servers, caplog):
    """The broker, not the proxy, decides about an API it may know and we do not: it
    closes that connection; the proxy only logs why and keeps serving."""

    async def body(server: ProxyServer) -> None:
        host, port = parse_host_port(server.bootstrap_servers)
        reader, writer = await asyncio.open_connection(host, port)
        writer.writelines(encode_frame(encode_request_header(9999, 0, 7, "from-the-future", 1), b"\x00" * 16))
        assert await _closed_by_proxy(reader)
        writer.close()
        await _metadata_ok(server.bootstrap_servers)

    with caplog.at_level(logging.INFO, logger="tierproxy.proxy"):
        metrics = _with_proxy(run, bootstrap_servers, body)
    assert metrics.value("tierproxy_requests_forwarded_total", {"api": "UNKNOWN_9999"}) == 1
    assert any("broker closed the connection" in r.getMessage() for r in caplog.records)


@RUNNERS
def test_unreachable_broker_closes_the_client_with_a_log_line(run, caplog):
    dead = f"127.0.0.1:{free_port()}"

    async def body(server: ProxyServer) -> None:
        host, port = parse_host_port(server.bootstrap_servers)
        reader, writer = await asyncio.open_connection(host, port)
        assert await _closed_by_proxy(reader)
        writer.close()

    with caplog.at_level(logging.WARNING, logger="tierproxy.proxy"):
        metrics = _with_proxy(run, dead, body)
    assert any("cannot connect to the broker" in r.getMessage() and dead in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert metrics.value("tierproxy_connections_closed_total", {"reason": "broker_unreachable"}) == 1


@RUNNERS
def test_a_client_reset_is_logged_at_debug_and_counted_closed(run, bootstrap_servers, caplog):
    """A client that resets its connection (as a client killed or resetting in a loop
    does) is logged at DEBUG, as Kafka's broker logs a disconnection, not one INFO line per
    reset; it is counted closed, not an error."""
    peers: list[str] = []

    async def body(server: ProxyServer) -> None:
        await _metadata_ok(server.bootstrap_servers)  # the broker connection is there
        host, port = parse_host_port(server.bootstrap_servers)
        reader, writer = await asyncio.open_connection(host, port)
        local = writer.get_extra_info("sockname")
        peers.append(f"{local[0]}:{local[1]}")
        writer.writelines(encode_frame(encode_request_header(ApiKey.METADATA, 12, 1, "resetting", 2),
                                       b"\x01\x00\x00\x00"))
        await reader.readexactly(4)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST
        for _ in range(200):
            if any(peers[0] in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.01)
        await _metadata_ok(server.bootstrap_servers)

    with caplog.at_level(logging.DEBUG, logger="tierproxy.proxy"):
        metrics = _with_proxy(run, bootstrap_servers, body)
    lines = [r for r in caplog.records if peers[0] in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.DEBUG], [(r.levelname, r.getMessage()) for r in lines]
    assert "client connection lost" in lines[0].getMessage()
    assert metrics.value("tierproxy_connections_closed_total", {"reason": "closed"}) >= 1
    assert metrics.value("tierproxy_connections_closed_total", {"reason": "error"}) == 0
