"""The filter chain without a broker: order, one parse per request, the address filter
after the Fetch filter, and per-connection typed state. (The chain against the real
broker: test_addresses, test_tiered_*, test_fetch_sessions.)"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import uuid
from types import MappingProxyType
from typing import Any

import pytest

from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v16.request import FetchRequest
from kio.schema.fetch.v16.response import FetchResponse, NodeEndpoint
from kio.static.primitive import i16, i32

from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.codecs import INTERCEPTED, decode_response, encode_payload, encode_request
from tierproxy.protocol.headers import peek_request_header
from tierproxy.protocol.requests import list_offsets_request, metadata_request
from tierproxy.proxy.filters import (
    CallNext,
    ClientRequest,
    ConnectionContext,
    Filter,
    FilterChains,
    ProxyServices,
    Response,
    run_chain,
)
from tierproxy.proxy.filters import addresses, messages
from tierproxy.proxy.filters.addresses import BrokerAddressFilter
from tierproxy.proxy.filters.api_versions import ApiVersionsFilter
from tierproxy.proxy.filters.context import PerConnection
from tierproxy.proxy.filters.tiered_state import CONNECTION_TOPICS, FetchConnectionState
from tierproxy.protocol.fetch_wire import RemotePartition, encode_fetch_response, scan_fetch_response

PROXY_HOST = "proxy.example"
PORT_BASE = 40000


NO_PORT_FROM = 100  # nodes from here on have no listener


class Nodes:
    """The proxy's node directory: node N < NO_PORT_FROM is PROXY_HOST:PORT_BASE+N."""

    def __init__(self) -> None:
        self.learned: list[tuple[int, str, int]] = []

    async def learn(self, node_id: int, host: str, port: int) -> tuple[str, int] | None:
        self.learned.append((node_id, host, port))
        return self.advertised(node_id)

    def advertised(self, node_id: int) -> tuple[str, int] | None:
        return (PROXY_HOST, PORT_BASE + node_id) if node_id < NO_PORT_FROM else None


def _context(filters: FilterChains, answer: Any = None) -> ConnectionContext:
    """A connection whose broker answers every request with `answer` (a payload)."""

    async def forward(frame_body: Any) -> memoryview:
        assert answer is not None, "this test's requests never reach the broker"
        return memoryview(answer)

    services = ProxyServices(config=None, metrics=None, nodes=Nodes(), filters=filters)  # type: ignore[arg-type]
    return ConnectionContext(peer="127.0.0.1:5000", node_id=None, broker=("broker", 9092), services=services,
                             forward=forward)


def _request(kio_request: Any, correlation_id: int = 7) -> ClientRequest:
    body = memoryview(encode_request(kio_request, correlation_id, "client"))
    return ClientRequest(peek_request_header(body), body)


class Recording(Filter):
    """Notes each request on its way in and each response on its way out."""

    def __init__(self, name: str, log: list[str], apis: dict[int, range]) -> None:
        self.name = name
        self.log = log
        self.apis = apis

    async def handle(self, ctx: ConnectionContext, request: ClientRequest, call_next: CallNext) -> Response:
        self.log.append(f"request {self.name}")
        response = await call_next(request)
        self.log.append(f"response {self.name}")
        return response


async def test_a_request_meets_its_filters_in_order_and_the_response_in_reverse():
    log: list[str] = []
    first = Recording("first", log, {ApiKey.LIST_OFFSETS: range(1, 12), ApiKey.METADATA: range(0, 13)})
    second = Recording("second", log, {ApiKey.LIST_OFFSETS: range(5, 12)})
    filters = FilterChains([first, second])
    assert filters.chain(ApiKey.LIST_OFFSETS, 7) == (first, second)
    assert filters.chain(ApiKey.LIST_OFFSETS, 2) == (first,)  # second takes no v2
    assert filters.chain(ApiKey.PRODUCE, 9) == ()  # opaque
    ctx = _context(filters, answer=b"the broker's payload")
    request = _request(list_offsets_request({"t": [0]}, -1))
    response = await run_chain(filters.chain(ApiKey.LIST_OFFSETS, 7), ctx, request)
    assert log == ["request first", "request second", "response second", "response first"]
    assert bytes(response.payload) == b"the broker's payload"


async def test_a_request_is_decoded_once_for_the_whole_chain(monkeypatch):
    calls = []
    original = messages.decode_request

    def decode_request(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[:2])
        return original(*args, **kwargs)

    monkeypatch.setattr(messages, "decode_request", decode_request)
    seen = []

    class Reading(Filter):
        apis = {ApiKey.METADATA: range(0, 13)}

        async def handle(self, ctx: ConnectionContext, request: ClientRequest, call_next: CallNext) -> Response:
            seen.append(request.body)
            return await call_next(request)

    filters = FilterChains([Reading(), Reading(), Reading()])
    request = _request(metadata_request(["t"]))
    await run_chain(filters.chain(ApiKey.METADATA, 12), _context(filters, answer=b"x"), request)
    assert calls == [(ApiKey.METADATA, 12)]
    assert seen[0] is seen[1] is seen[2]


async def test_a_replaced_request_goes_upstream_with_the_clients_ids():
    sent = []

    async def forward(frame_body: Any) -> memoryview:
        sent.append(peek_request_header(bytes(frame_body)))
        return memoryview(b"answer")

    class Older(Filter):
        apis = {ApiKey.LIST_OFFSETS: range(1, 12)}

        async def handle(self, ctx: ConnectionContext, request: ClientRequest, call_next: CallNext) -> Response:
            response = await call_next(request.replaced(list_offsets_request({"t": [0]}, -2)))
            assert response.api_version == 7  # the version sent, decoded as such
            return response

    filters = FilterChains([Older()])
    ctx = dataclasses.replace(_context(filters), forward=forward)
    request = _request(list_offsets_request({"t": [0]}, -1), correlation_id=31)
    await run_chain(filters.chain(ApiKey.LIST_OFFSETS, 7), ctx, request)
    (header,) = sent
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        ApiKey.LIST_OFFSETS, 7, 31, "client")


def _tagged_section(endpoints: tuple[NodeEndpoint, ...]) -> bytes:
    """The top-level tagged-field section of a Fetch v16 response naming `endpoints`."""
    response = FetchResponse(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, responses=(),
                             node_endpoints=endpoints)
    section = scan_fetch_response(encode_payload(response), 16).tagged_fields
    assert section is not None
    return bytes(section)


class BuildingFetch(Filter):
    """Stands for the Fetch filter: answers with buffers it encoded (a remote partition's
    records as a slice of their buffer) and the broker's tagged fields."""

    apis = {ApiKey.FETCH: INTERCEPTED[ApiKey.FETCH]}

    def __init__(self, records: memoryview, section: bytes) -> None:
        self.records = records
        self.section = section

    async def handle(self, ctx: ConnectionContext, request: ClientRequest, call_next: CallNext) -> Response:
        remote = RemotePartition(0, 0, 100, 100, 0, None, [self.records], len(self.records))
        parts = encode_fetch_response(16, [(uuid.UUID(int=1), [remote])], tagged_fields=self.section)
        return Response.encoded(ApiKey.FETCH, 16, parts, tagged_fields=self.section)


def _fetch_chain(records: memoryview, section: bytes) -> tuple[FilterChains, ClientRequest]:
    filters = FilterChains([BrokerAddressFilter(), BuildingFetch(records, section)])
    request = FetchRequest(max_wait=datetime.timedelta(0), min_bytes=i32(1), max_bytes=i32(1 << 20),
                           isolation_level=0, session_id=i32(0), session_epoch=i32(-1), topics=(),
                           forgotten_topics_data=(), rack_id="")
    return filters, _request(request)


async def test_the_address_filter_rewrites_the_node_endpoints_of_the_fetch_filters_response():
    records = memoryview(bytearray(b"record batches" * 10))
    section = _tagged_section((NodeEndpoint(node_id=i32(1), host="broker-1", port=i32(9092), rack="r1"),))
    filters, request = _fetch_chain(records, section)
    assert filters.chain(ApiKey.FETCH, 16) == tuple(filters)  # the address filter first, Fetch last
    ctx = _context(filters)
    response = await run_chain(filters.chain(ApiKey.FETCH, 16), ctx, request)
    decoded = decode_response(ApiKey.FETCH, 16, b"".join(bytes(p) for p in response.parts))
    assert [(e.node_id, e.host, e.port, e.rack) for e in decoded.node_endpoints] == [
        (1, PROXY_HOST, PORT_BASE + 1, "r1")]
    assert ctx.services.nodes.learned == [(1, "broker-1", 9092)]  # type: ignore[attr-defined]
    assert decoded.responses[0].partitions[0].records == bytes(records)
    # The records went on as the Fetch filter's slice, not copied.
    assert any(isinstance(p, memoryview) and p.obj is records.obj for p in response.parts)


async def test_a_fetch_response_without_node_endpoints_passes_the_address_filter_untouched(monkeypatch):
    def no_decoding(*args: Any) -> Any:
        raise AssertionError("a Fetch response without node endpoints was decoded")

    monkeypatch.setattr(addresses, "decode_response", no_decoding)
    monkeypatch.setattr(addresses, "scan_fetch_response", no_decoding)
    records = memoryview(bytearray(b"batches"))
    _, request = _fetch_chain(records, b"\x00")
    built = []

    class Spying(BuildingFetch):
        async def handle(self, ctx: ConnectionContext, request: ClientRequest, call_next: CallNext) -> Response:
            built.append(await super().handle(ctx, request, call_next))
            return built[-1]

    filters = FilterChains([BrokerAddressFilter(), Spying(records, b"\x00")])
    response = await run_chain(filters.chain(ApiKey.FETCH, 16), _context(filters), request)
    assert response is built[0]


async def test_the_broker_api_versions_are_state_of_their_connection():
    filters = FilterChains([ApiVersionsFilter(), BrokerAddressFilter()])
    answer = ApiVersionsResponse(error_code=ErrorCode.none, throttle_time=datetime.timedelta(0), api_keys=(
        ApiVersion(api_key=i16(ApiKey.LIST_OFFSETS), min_version=i16(1), max_version=i16(7)),
        ApiVersion(api_key=i16(ApiKey.METADATA), min_version=i16(0), max_version=i16(99)),
        ApiVersion(api_key=i16(ApiKey.PRODUCE), min_version=i16(3), max_version=i16(99)),
    ))
    asked, other = _context(filters, answer=encode_payload(answer)), _context(filters)
    request = _request(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    response = await run_chain(filters.chain(ApiKey.API_VERSIONS, 3), asked, request)
    assert asked.broker_api_versions == {ApiKey.LIST_OFFSETS: (1, 7), ApiKey.METADATA: (0, 99),
                                         ApiKey.PRODUCE: (3, 99)}
    assert other.broker_api_versions == {}
    assert asked.correlation_ids is not other.correlation_ids
    offered = {a.api_key: (a.min_version, a.max_version) for a in response.body.api_keys}
    # Capped where a filter cannot read newer versions; the broker's range elsewhere.
    assert offered[ApiKey.METADATA] == (0, INTERCEPTED[ApiKey.METADATA].stop - 1)
    assert offered[ApiKey.PRODUCE][1] == BrokerAddressFilter.apis[ApiKey.PRODUCE].stop - 1
    assert offered[ApiKey.LIST_OFFSETS] == (1, 7)


@pytest.mark.parametrize("api_version", [14, 15])
def test_the_address_filter_is_not_in_fetch_chains_without_node_endpoints(api_version):
    filters = FilterChains([BrokerAddressFilter()])
    assert filters.chain(ApiKey.FETCH, api_version) == ()
    assert filters.chain(ApiKey.FETCH, 16) != ()


async def test_a_node_without_a_listener_is_never_named_to_clients():
    """Left out of broker lists and node endpoints; as a coordinator, COORDINATOR_NOT_AVAILABLE."""
    from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest as FindCoordinatorV3
    from kio.schema.find_coordinator.v3.response import FindCoordinatorResponse as CoordinatorV3
    from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest as FindCoordinatorV6
    from kio.schema.find_coordinator.v6.response import Coordinator, FindCoordinatorResponse as CoordinatorV6
    from kio.schema.metadata.v12.response import MetadataResponse, MetadataResponseBroker

    filters = FilterChains([BrokerAddressFilter()])
    brokers = tuple(MetadataResponseBroker(node_id=i32(n), host=f"broker-{n}", port=i32(9092), rack=None)
                    for n in (1, NO_PORT_FROM + 1))
    metadata = MetadataResponse(throttle_time=datetime.timedelta(0), brokers=brokers, cluster_id="c",
                                controller_id=i32(1), topics=())
    ctx = _context(filters, answer=encode_payload(metadata))
    response = await run_chain(filters.chain(ApiKey.METADATA, 12), ctx, _request(metadata_request(())))
    assert [(b.node_id, b.host, b.port) for b in response.body.brokers] == [(1, PROXY_HOST, PORT_BASE + 1)]

    elsewhere = NO_PORT_FROM + 1
    v6 = CoordinatorV6(throttle_time=datetime.timedelta(0), coordinators=(
        Coordinator(key="g", node_id=i32(elsewhere), host="broker", port=i32(9092), error_code=ErrorCode.none,
                    error_message=None),))
    ctx = _context(filters, answer=encode_payload(v6))
    answer = await run_chain(filters.chain(ApiKey.FIND_COORDINATOR, 6), ctx,
                             _request(FindCoordinatorV6(key_type=0, coordinator_keys=("g",))))
    (coordinator,) = answer.body.coordinators
    assert (coordinator.error_code, coordinator.node_id, coordinator.host, coordinator.port) == (
        ErrorCode.coordinator_not_available, -1, "", -1)
    assert f"node {elsewhere}" in coordinator.error_message
    v3 = CoordinatorV3(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, error_message=None,
                       node_id=i32(elsewhere), host="broker", port=i32(9092))
    ctx = _context(filters, answer=encode_payload(v3))
    answer = await run_chain(filters.chain(ApiKey.FIND_COORDINATOR, 3), ctx,
                             _request(FindCoordinatorV3(key="g", key_type=0)))
    assert (answer.body.error_code, answer.body.node_id) == (ErrorCode.coordinator_not_available, -1)

    section = _tagged_section((NodeEndpoint(node_id=i32(2), host="broker-2", port=i32(9092), rack=None),
                               NodeEndpoint(node_id=i32(elsewhere), host="broker", port=i32(9092), rack=None)))
    filters, request = _fetch_chain(memoryview(bytearray(b"batches")), section)
    response = await run_chain(filters.chain(ApiKey.FETCH, 16), _context(filters), request)
    decoded = decode_response(ApiKey.FETCH, 16, b"".join(bytes(p) for p in response.parts))
    assert [e.node_id for e in decoded.node_endpoints] == [2]


def test_a_chain_is_worked_out_once_per_api_version():
    filters = FilterChains([BrokerAddressFilter(), ApiVersionsFilter()])
    first = filters.chain(ApiKey.METADATA, 12)
    assert first and filters.chain(ApiKey.METADATA, 12) is first
    assert filters.chain(ApiKey.METADATA, 10_000) == ()  # a version no filter takes
    many = [filters.chain(ApiKey.METADATA, version) for version in range(20_000)]  # bounded, still right
    assert [bool(chain) for chain in many] == [version in BrokerAddressFilter.apis[ApiKey.METADATA]
                                                for version in range(20_000)]


class _Counting(Filter):
    """A filter with state of its own per connection: how many requests it saw there."""

    apis = MappingProxyType({ApiKey.API_VERSIONS: range(0, 4)})

    def __init__(self) -> None:
        self.seen = PerConnection(lambda ctx: collections.Counter[str]())

    async def handle(self, ctx, request, call_next):
        counter = self.seen.of(ctx)
        counter[ctx.peer] += 1
        return await call_next(request)


async def test_a_filters_state_is_made_per_connection_by_its_factory_and_seen_by_no_other():
    counting = _Counting()
    filters = FilterChains([counting])
    answer = encode_payload(ApiVersionsResponse(error_code=ErrorCode.none, throttle_time=datetime.timedelta(0),
                                                api_keys=()))
    first, second = _context(filters, answer=answer), _context(filters, answer=answer)
    for ctx, times in ((first, 3), (second, 1)):
        for _ in range(times):
            await run_chain(filters.chain(ApiKey.API_VERSIONS, 3), ctx,
                            _request(ApiVersionsRequest(client_software_name="t", client_software_version="1")))
    assert counting.seen.of(first) is not counting.seen.of(second)
    assert (sum(counting.seen.of(first).values()), sum(counting.seen.of(second).values())) == (3, 1)
    # The tiered filters' states likewise: the topics a connection learned are its own.
    assert CONNECTION_TOPICS.of(first) is CONNECTION_TOPICS.of(first) is not CONNECTION_TOPICS.of(second)
    assert FetchConnectionState.of_connection(first).topics is CONNECTION_TOPICS.of(first)


def test_a_request_that_gets_no_response_meets_only_the_filters_that_admit_it():
    """A Produce with acks=0 meets no chain: without a filter overriding `admit` (a proxy
    without read replica topics) it is forwarded at once, never decoded."""

    class Admitting(Filter):
        apis = {ApiKey.PRODUCE: range(3, 14)}

        async def admit(self, ctx: ConnectionContext, request: ClientRequest) -> None:
            pass

    plain = FilterChains([BrokerAddressFilter(), ApiVersionsFilter()])
    assert plain.chain(ApiKey.PRODUCE, 12)  # the address filter rewrites Produce responses
    assert plain.admitting(ApiKey.PRODUCE, 12) == ()
    admitting = Admitting()
    filters = FilterChains([BrokerAddressFilter(), admitting])
    assert filters.admitting(ApiKey.PRODUCE, 12) == (admitting,)
    assert filters.admitting(ApiKey.PRODUCE, 2) == ()
