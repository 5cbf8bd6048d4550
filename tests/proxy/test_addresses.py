"""The 3-broker cluster behind the proxy: clients only ever see the proxy's addresses,
and produce/consume works with partitions led by different nodes."""

from __future__ import annotations

import asyncio
import struct
import time
import uuid

from collections.abc import Iterator

import pytest

from aiokafka import AIOKafkaProducer
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.describe_cluster.v0.request import DescribeClusterRequest as DescribeClusterRequestV0
from kio.schema.describe_cluster.v2.request import DescribeClusterRequest as DescribeClusterRequestV2
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest as FindCoordinatorRequestV3
from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest as FindCoordinatorRequestV6
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.static.primitive import i8

from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.codecs import INTERCEPTED, decode_response
from tierproxy.protocol.framing import FrameDecoder, encode_frame
from tierproxy.protocol.headers import encode_request_header, parse_response_header
from tierproxy.client.connection import KafkaConnection
from tierproxy.proxy.metrics import ProxyMetrics
from tierproxy.proxy.serve import build_filters
from tierproxy.config.addresses import parse_host_port
from tests.helpers.consume import confluent_key, consume_aiokafka, consume_confluent
from tests.helpers.proxy import ProxyThread, proxy_config

NODES = 3


@pytest.fixture(scope="module")
def proxy3(kafka_cluster_3) -> Iterator[ProxyThread]:
    # No start-up discovery: the node listeners must open from the clients' Metadata.
    proxy = ProxyThread(proxy_config(kafka_cluster_3.bootstrap_servers, NODES), discover=False).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def replicated_topic(kafka_cluster_3) -> Iterator[str]:
    name = f"replicated-{uuid.uuid4().hex[:8]}"
    kafka_cluster_3.create_topic(name, partitions=6, replication=3)
    yield name
    kafka_cluster_3.delete_topic(name)


def _proxy_addresses(proxy: ProxyThread) -> dict[int, tuple[str, int]]:
    base = proxy.config["proxy.broker.port.base"]
    return {node: ("127.0.0.1", base + node) for node in range(NODES)}


async def _open(proxy: ProxyThread) -> KafkaConnection:
    host, port = parse_host_port(proxy.bootstrap_servers)
    return await KafkaConnection.open(host, port)


async def test_metadata_names_only_proxy_listeners(kafka_cluster_3, proxy3, replicated_topic):
    request = MetadataRequest(topics=(MetadataRequestTopic(topic_id=None, name=replicated_topic),),
                              allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    async with await _open(proxy3) as connection:
        # The broker that answers may not have applied the new topic yet.
        deadline = time.monotonic() + 20
        while True:
            response = await connection.request(request)
            partitions = [p for t in response.topics for p in t.partitions if t.error_code == 0]
            if len(partitions) == 6 and all(p.leader_id >= 0 for p in partitions) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
    assert brokers == _proxy_addresses(proxy3)
    # The listeners named were opened before the answer went out.
    assert proxy3.call(lambda: proxy3.server.node_listeners) == _proxy_addresses(proxy3)
    assert proxy3.call(lambda: proxy3.server.brokers) == {n: (h, p) for n, h, p in kafka_cluster_3.brokers}
    leaders = {p.leader_id for t in response.topics for p in t.partitions}
    assert len(leaders) > 1, "the partitions should be led by different nodes"


async def test_find_coordinator_and_describe_cluster_name_only_proxy_listeners(proxy3):
    expected = _proxy_addresses(proxy3)
    group = f"g-{uuid.uuid4().hex[:8]}"
    async with await _open(proxy3) as connection:
        new = await connection.request(FindCoordinatorRequestV6(key_type=i8(0), coordinator_keys=(group,)))
        old = await connection.request(FindCoordinatorRequestV3(key=group, key_type=i8(0)))
        cluster0 = await connection.request(DescribeClusterRequestV0(include_cluster_authorized_operations=False))
        cluster2 = await connection.request(DescribeClusterRequestV2(
            include_cluster_authorized_operations=False, endpoint_type=i8(1), include_fenced_brokers=False))
    for coordinator in new.coordinators:
        if coordinator.node_id >= 0:  # the group's coordinator may still be loading
            assert (coordinator.host, coordinator.port) == expected[coordinator.node_id]
    if old.node_id >= 0:
        assert (old.host, old.port) == expected[old.node_id]
    for cluster in (cluster0, cluster2):
        assert {b.broker_id: (b.host, b.port) for b in cluster.brokers} == expected


async def test_api_versions_caps_intercepted_apis_at_what_the_proxy_handles(kafka_cluster_3, proxy3):
    request = ApiVersionsRequest(client_software_name="tierproxy-test", client_software_version="1")
    host, port = kafka_cluster_3.brokers[0][1:]
    async with await KafkaConnection.open(host, port) as direct:
        broker = {a.api_key: (a.min_version, a.max_version) for a in (await direct.request(request)).api_keys}
    async with await _open(proxy3) as connection:
        proxied = {a.api_key: (a.min_version, a.max_version) for a in (await connection.request(request)).api_keys}
    assert proxied.keys() == broker.keys()
    filters = build_filters(proxy3.config, ProxyMetrics())
    for api_key, (low, high) in broker.items():
        handling = filters.filters_of(api_key)
        if not handling:  # pass-through APIs: exactly the broker's versions
            assert proxied[api_key] == (low, high), ApiKey(api_key).name
        else:  # no newer version than every filter of the API can read
            top = min(f.apis[api_key].stop - 1 for f in handling)
            assert proxied[api_key] == (low, min(high, top)), ApiKey(api_key).name
    for api_key in INTERCEPTED:
        assert proxied[api_key][1] <= INTERCEPTED[api_key].stop - 1


async def test_api_versions_the_broker_rejects_pass_through_unchanged(proxy3):
    """A version newer than anyone knows gets the broker's own UNSUPPORTED_VERSION
    answer: a v0 body naming the ApiVersions versions the broker supports (KIP-511)."""
    host, port = parse_host_port(proxy3.bootstrap_servers)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        header = encode_request_header(ApiKey.API_VERSIONS, 127, 42, "future-client", 2)
        writer.writelines(encode_frame(header, b"\x00"))  # an empty tagged-field section
        decoder = FrameDecoder()
        frames: list[memoryview] = []
        while not frames:
            data = await asyncio.wait_for(reader.read(65536), 10)
            assert data, "the proxy closed the connection"
            frames = decoder.feed(data)
    finally:
        writer.close()
    correlation_id, offset = parse_response_header(frames[0], 0)
    assert correlation_id == 42
    assert struct.unpack_from(">h", frames[0], offset)[0] == 35  # UNSUPPORTED_VERSION
    response = decode_response(ApiKey.API_VERSIONS, 0, frames[0][offset:])
    assert [a.api_key for a in response.api_keys] == [ApiKey.API_VERSIONS]
    assert response.api_keys[0].max_version >= 3


async def test_produce_and_consume_across_three_leaders(proxy3, replicated_topic):
    producer = AIOKafkaProducer(bootstrap_servers=proxy3.bootstrap_servers, acks="all")
    await producer.start()
    try:
        sent = []
        for i in range(120):
            meta = await producer.send_and_wait(replicated_topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 6)
            sent.append((meta.partition, meta.offset, b"k%d" % i, b"v%d" % i))
    finally:
        await producer.stop()
    records = await consume_aiokafka(proxy3.bootstrap_servers, replicated_topic, len(sent))
    assert sorted((r.partition, r.offset, r.key, r.value) for r in records) == sorted(sent)
    messages = consume_confluent(proxy3.bootstrap_servers, replicated_topic, len(sent))
    assert sorted(confluent_key(m) for m in messages) == sorted(sent)
    # Each node's listener carried client connections: traffic went through the proxy.
    for node in range(NODES):
        assert proxy3.metrics.value("tierproxy_connections_total", {"listener": f"node-{node}"}) >= 1
