"""Responses reach the client in request order, even when an intercepted one finishes
late. The upstream here is a small fake broker (it answers in order, after a delay,
as Kafka does); the proxy code is the real one, on asyncio and on uvloop."""

from __future__ import annotations

import asyncio
import logging
import struct

from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from tierproxy.protocol.acks import expects_response
from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.framing import FrameDecoder, encode_frame
from tierproxy.protocol.headers import encode_request_header, peek_request_header
from tierproxy.proxy.filters import CallNext, ClientRequest, ConnectionContext, Filter, FilterChains, Response
from tierproxy.proxy.metrics import ProxyMetrics
from tierproxy.proxy.ordering import ResponseOrderer
from tierproxy.config.addresses import parse_host_port
from tierproxy.proxy.server import ProxyServer
from tests.helpers.proxy import proxy_config

RUNNERS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


def test_orderer_holds_younger_responses_until_older_ones_went_out():
    written: list[Any] = []
    orderer = ResponseOrderer(lambda parts, leases: written.append(parts))
    first, second, third = (orderer.reserve(0, i) for i in (1, 2, 3))
    orderer.complete(third, ["c"])
    orderer.complete(second, ["b"])
    assert written == [] and len(orderer) == 3
    orderer.complete(first, ["a"])
    assert written == [["a"], ["b"], ["c"]] and len(orderer) == 0
    fourth = orderer.reserve(0, 4)
    orderer.complete(fourth, ["d"])  # at the head: written at once
    assert written[-1] == ["d"]


class FakeBroker(asyncio.Protocol):
    """Answers every request, in order, with its correlation id and ``answer-<id>``,
    each after ``delay`` seconds; Produce with acks=0 gets no answer, as in Kafka."""

    delay = 0.05
    seen: list[int]

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.decoder = FrameDecoder()
        self.queue: asyncio.Queue[int] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._answer())

    def data_received(self, data: bytes) -> None:
        for body in self.decoder.feed(data):
            header = peek_request_header(body)
            FakeBroker.seen.append(header.correlation_id)
            if not expects_response(header, body):
                continue
            self.queue.put_nowait(header.correlation_id)

    async def _answer(self) -> None:
        while True:
            correlation_id = await self.queue.get()
            await asyncio.sleep(self.delay)
            self.transport.writelines(encode_frame(struct.pack(">i", correlation_id), b"answer-%d" % correlation_id))

    def connection_lost(self, exc: Exception | None) -> None:
        self.task.cancel()


class SlowListOffsets(Filter):
    """Forwards, then takes a long time (as a remote read would) before answering."""

    apis = {ApiKey.LIST_OFFSETS: range(1, 2)}

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    async def handle(self, ctx: ConnectionContext, request: ClientRequest, call_next: CallNext) -> Response:
        if self.fail:
            raise RuntimeError("remote storage exploded")
        payload = (await call_next(request)).payload
        await asyncio.sleep(0.3)
        return Response.encoded(request.api_key, request.api_version, [b"slow:", bytes(payload)])


def _request(api_key: int, version: int, correlation_id: int, payload: bytes = b"") -> list[bytes]:
    return encode_frame(encode_request_header(api_key, version, correlation_id, "ordering-test", 1), payload)


def _produce_v3(correlation_id: int, acks: int) -> list[bytes]:
    # transactional id null, acks, timeout, no topics
    return _request(ApiKey.PRODUCE, 3, correlation_id, struct.pack(">hhii", -1, acks, 1000, 0))


async def _read_responses(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    decoder = FrameDecoder()
    out: list[bytes] = []
    while len(out) < count:
        data = await asyncio.wait_for(reader.read(65536), 10)
        assert data, f"connection closed after {out}"
        out.extend(bytes(body) for body in decoder.feed(data))
    return out


async def _in_one_write(server: ProxyServer, requests: list[list[bytes]], answered: int) -> list[bytes]:
    """Send `requests` in one write on a new connection (they arrive together); the first
    `answered` responses."""
    reader, writer = await asyncio.open_connection(*parse_host_port(server.bootstrap_servers))
    try:
        writer.writelines([part for request in requests for part in request])
        return await _read_responses(reader, answered)
    finally:
        writer.close()


def _with_fake_broker(run: Callable[[Coroutine[Any, Any, None]], None], filter_: Filter,
                      body: Callable[[ProxyServer], Coroutine[Any, Any, None]]) -> None:
    FakeBroker.seen = []

    async def main() -> None:
        broker = await asyncio.get_running_loop().create_server(FakeBroker, "127.0.0.1", 0)
        port = broker.sockets[0].getsockname()[1]
        config = proxy_config(f"127.0.0.1:{port}", 1)
        server = ProxyServer(config, FilterChains([filter_]), ProxyMetrics())
        try:
            await server.start(discover=False)  # the fake broker knows no Metadata
            # Nor SASL: said up front, so that the proxy does not ask it before the first client.
            server.upstream.learned(needs_sasl=False, how="the fake broker has no SASL")
            await body(server)
        finally:
            await server.close()
            broker.close()
            await broker.wait_closed()

    run(main())


@RUNNERS
def test_responses_come_back_in_request_order(run):
    async def body(server: ProxyServer) -> None:
        # The intercepted request and the pass-through ones behind it arrive together.
        responses = await _in_one_write(server, [
            _request(ApiKey.LIST_OFFSETS, 1, 1),
            _request(ApiKey.METADATA, 1, 2),
            _produce_v3(3, acks=0),  # no response
            _request(ApiKey.METADATA, 1, 4),
            _request(ApiKey.LIST_OFFSETS, 1, 5),
            _request(ApiKey.METADATA, 1, 6),
        ], 5)
        assert responses == [
            struct.pack(">i", 1) + b"slow:answer-1",
            struct.pack(">i", 2) + b"answer-2",
            struct.pack(">i", 4) + b"answer-4",
            struct.pack(">i", 5) + b"slow:answer-5",
            struct.pack(">i", 6) + b"answer-6",
        ]
        # The broker saw every request in client order: the pass-through ones behind an
        # intercepted request waited for it, as behind a broker's muted channel.
        assert FakeBroker.seen == [1, 2, 3, 4, 5, 6]

    _with_fake_broker(run, SlowListOffsets(), body)


class QueryingListOffsets(Filter):
    """Forwards the client's request, then later asks the broker something of its own,
    as the Fetch filter asks for a partition's log start offset."""

    apis = {ApiKey.LIST_OFFSETS: range(1, 2)}

    async def handle(self, ctx: ConnectionContext, request: ClientRequest, call_next: CallNext) -> Response:
        payload = (await call_next(request)).payload
        await asyncio.sleep(0.1)
        query = encode_request_header(ApiKey.METADATA, 1, -request.header.correlation_id, "ordering-test", 1)
        await ctx.forward(query)
        return Response.encoded(request.api_key, request.api_version, [b"queried:", bytes(payload)])


@RUNNERS
def test_requests_behind_an_intercepted_one_reach_the_broker_after_its_own_queries(run):
    async def body(server: ProxyServer) -> None:
        responses = await _in_one_write(server, [_request(ApiKey.LIST_OFFSETS, 1, 1), _produce_v3(2, acks=1),
                                                 _request(ApiKey.METADATA, 1, 3)], 3)
        assert [r[:4] for r in responses] == [struct.pack(">i", i) for i in (1, 2, 3)]
        assert FakeBroker.seen == [1, -1, 2, 3]

    _with_fake_broker(run, QueryingListOffsets(), body)


@RUNNERS
@pytest.mark.parametrize("failing, message", [
    (lambda: SlowListOffsets(fail=True), "remote storage exploded"),
    (lambda: PassingListOffsets(fail=True), "the answer does not parse"),  # its check of the answer fails
], ids=["handle", "pass_through"])
def test_failing_filter_closes_only_its_connection(run, caplog, failing, message):
    async def body(server: ProxyServer) -> None:
        host, port = parse_host_port(server.bootstrap_servers)
        bad_reader, bad_writer = await asyncio.open_connection(host, port)
        good_reader, good_writer = await asyncio.open_connection(host, port)
        try:
            bad_writer.writelines(_request(ApiKey.LIST_OFFSETS, 1, 1))
            with pytest.raises((AssertionError, ConnectionResetError)):
                await _read_responses(bad_reader, 1)
            good_writer.writelines(_request(ApiKey.METADATA, 1, 9))
            assert await _read_responses(good_reader, 1) == [struct.pack(">i", 9) + b"answer-9"]
        finally:
            bad_writer.close()
            good_writer.close()

    with caplog.at_level(logging.ERROR, logger="tierproxy.proxy"):
        _with_fake_broker(run, failing(), body)
    assert any(message in r.getMessage() for r in caplog.records)


class PassingListOffsets(Filter):
    """Lets every ListOffsets pass (as the Fetch filter lets a Fetch at the tail pass); its
    check sends the answers of odd correlation ids to the chain, which handles them late."""

    apis = {ApiKey.LIST_OFFSETS: range(1, 2)}

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.checked: list[bytes] = []
        self.handled: list[tuple[int, bytes]] = []

    def pass_through(self, ctx: ConnectionContext, request: ClientRequest) -> Callable[[Response], bool]:
        def check(response: Response) -> bool:
            if self.fail:
                raise RuntimeError("the answer does not parse")
            self.checked.append(bytes(response.payload))
            return request.header.correlation_id % 2 == 0

        return check

    async def handle(self, ctx: ConnectionContext, request: ClientRequest, call_next: CallNext) -> Response:
        payload = bytes((await call_next(request)).payload)
        self.handled.append((request.header.correlation_id, payload))
        await asyncio.sleep(0.2)
        return Response.encoded(request.api_key, request.api_version, [b"handled:", payload])


@RUNNERS
def test_a_request_its_filters_let_pass_meets_no_chain_unless_its_answer_needs_one(run):
    passing = PassingListOffsets()

    async def body(server: ProxyServer) -> None:
        responses = await _in_one_write(server, [
            _request(ApiKey.LIST_OFFSETS, 1, 2),
            _request(ApiKey.METADATA, 1, 3),
            _request(ApiKey.LIST_OFFSETS, 1, 5),  # its answer goes to the chain
            _request(ApiKey.METADATA, 1, 6),
            _request(ApiKey.LIST_OFFSETS, 1, 8),
        ], 5)
        assert responses == [
            struct.pack(">i", 2) + b"answer-2",
            struct.pack(">i", 3) + b"answer-3",
            struct.pack(">i", 5) + b"handled:answer-5",
            struct.pack(">i", 6) + b"answer-6",
            struct.pack(">i", 8) + b"answer-8",
        ]
        # Each request reached the broker once, in client order: the chain took the answer
        # already there, and the requests behind it waited for it.
        assert FakeBroker.seen == [2, 3, 5, 6, 8]
        assert passing.checked == [b"answer-2", b"answer-5", b"answer-8"]
        assert passing.handled == [(5, b"answer-5")]

    _with_fake_broker(run, passing, body)

