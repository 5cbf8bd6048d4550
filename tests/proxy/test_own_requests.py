"""The proxy's own requests on a client's connection carry correlation ids of their own
(-1, -2, ...), never the client's, and the client's client id (its quotas); the tiered
filters' queries go out that way, timed per API."""

from __future__ import annotations

import asyncio

from kio.schema.list_offsets.v7.response import (
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
)
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64
from prometheus_client import CollectorRegistry

from tierproxy.client.queries import LogOffsets
from tierproxy.protocol.codecs import encode_response
from tierproxy.protocol.headers import parse_response_header, peek_request_header, response_header_version
from tierproxy.protocol.requests import list_offsets_request, milliseconds
from tierproxy.proxy.filters import ConnectionContext, OwnCorrelationIds
from tierproxy.proxy.filters.tiered_state import broker_queries
from tierproxy.remote_log.metrics import RemoteMetrics


def _answer(correlation_id: int, offset: int) -> memoryview:
    response = ListOffsetsResponse(throttle_time=milliseconds(0), topics=(ListOffsetsTopicResponse(
        name="t", partitions=(ListOffsetsPartitionResponse(partition_index=i32(0), error_code=ErrorCode.none,
                                                           timestamp=i64(-1), offset=i64(offset),
                                                           leader_epoch=i32(0)),)),))
    body = memoryview(encode_response(response, correlation_id))
    _, offset_ = parse_response_header(body, response_header_version(2, 7))
    return body[offset_:]


class Upstream:
    """The client's upstream connection: answers each request a little later, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, str | None]] = []

    async def forward(self, frame_body) -> memoryview:
        header = peek_request_header(bytes(frame_body))
        self.sent.append((header.correlation_id, header.client_id))
        await asyncio.sleep(0)
        return _answer(header.correlation_id, 42)


def _context(upstream: Upstream) -> ConnectionContext:
    # No filter here needs the proxy's services: only the connection's own requests.
    return ConnectionContext(peer="127.0.0.1:5000", node_id=None, broker=("127.0.0.1", 9092),
                             services=None, forward=upstream.forward)  # type: ignore[arg-type]


async def test_internal_requests_use_their_own_correlation_ids_and_the_clients_client_id():
    upstream = Upstream()
    ctx = _context(upstream)
    metrics = RemoteMetrics(CollectorRegistry())
    queries = broker_queries(ctx, "client", metrics)
    for _ in range(2):
        answer = await queries.list_offsets({"t": [0]}, -1)
        assert answer[("t", 0)].offset == 42
    # The log offsets' ListOffsets go out together, each with an id of its own.
    assert await queries.log_offsets({"t": [0]}, isolation_level=1) == {("t", 0): LogOffsets(42, 42, 42)}
    assert upstream.sent == [(-1, "client"), (-2, "client"), (-3, "client"), (-4, "client"), (-5, "client")]
    assert metrics.value("tierproxy_broker_query_seconds_count", {"api": "LIST_OFFSETS"}) == 5


async def test_each_connection_counts_its_own_ids():
    first, second = Upstream(), Upstream()
    await _context(first).send(list_offsets_request({"t": [0]}, -1), "c")
    await _context(second).send(list_offsets_request({"t": [0]}, -1), "c")
    assert first.sent == second.sent == [(-1, "c")]


def test_correlation_ids_wrap_within_int32():
    ids = OwnCorrelationIds()
    ids._ids = iter([-(2**31), -(2**31) - 1])  # the last two the counter could give
    assert ids.next() == -(2**31)
    assert ids.next() == -1
    assert ids.next() == -2
