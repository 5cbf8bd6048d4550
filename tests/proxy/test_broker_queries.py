"""The proxy's own requests on a client's connection carry correlation ids of their own
(-1, -2, ...), never the client's, and the client's client id (its quotas)."""

from __future__ import annotations

from kio.schema.list_offsets.v7.response import (
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
)
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from tierproxy.protocol.codecs import encode_response
from tierproxy.protocol.headers import parse_response_header, peek_request_header, response_header_version
from tierproxy.protocol.requests import milliseconds
from tierproxy.proxy.filters.broker_queries import BrokerQueries, TierConnectionState


def _answer(correlation_id: int) -> memoryview:
    response = ListOffsetsResponse(throttle_time=milliseconds(0), topics=(ListOffsetsTopicResponse(
        name="t", partitions=(ListOffsetsPartitionResponse(partition_index=i32(0), error_code=ErrorCode.none,
                                                           timestamp=i64(-1), offset=i64(42),
                                                           leader_epoch=i32(0)),)),))
    body = memoryview(encode_response(response, correlation_id))
    _, offset = parse_response_header(body, response_header_version(2, 7))
    return body[offset:]


async def test_internal_requests_use_their_own_correlation_ids():
    # ListOffsets v7 (request header v2), correlation id 7, client id "client", no tagged fields
    client = peek_request_header(bytes.fromhex("0002000700000007") + b"\x00\x06client\x00")
    sent = []

    async def forward(frame_body):
        header = peek_request_header(bytes(frame_body))
        sent.append((header.correlation_id, header.client_id))
        return _answer(header.correlation_id)

    state = TierConnectionState()
    queries = BrokerQueries(client, forward, state)
    for _ in range(3):
        answer = await queries.list_offsets({"t": [0]}, -1)
        assert answer[("t", 0)][1] == 42
    assert sent == [(-1, "client"), (-2, "client"), (-3, "client")]


def test_correlation_ids_wrap_within_int32():
    state = TierConnectionState()
    state.correlation_ids = iter([-(2**31), -(2**31) - 1])  # the last two the counter could give
    assert state.next_correlation_id() == -(2**31)
    assert state.next_correlation_id() == -1
    assert state.next_correlation_id() == -2
