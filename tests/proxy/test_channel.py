"""A client connection to the proxy behaves like a broker's channel: requests reach the
broker in the order the client sent them, malformed requests close the connection
with one WARN line, idle and half-sent connections are closed, and connection limits
refuse at once. Real bytes on real sockets, against the testbed broker."""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from types import MappingProxyType

import pytest
from confluent_kafka import Producer

from tierproxy.protocol.apis import ApiKey, OffsetSpec
from tierproxy.protocol.codecs import decode_response_frame, encode_request
from tierproxy.protocol.headers import encode_request_header
from tierproxy.proxy.filters import Filter
from tierproxy.protocol.requests import list_offsets_request
from testbed.kafka import ADMIN_USER
from testbed.raw import api_versions, closed_by_peer, frame, read_frames, sasl_handshake, sasl_plain
from tests.helpers.batches import batch
from tests.helpers.proxy import ProxyThread, proxy_config
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.timeout(120)


def produce_request(topic: str, correlation_id: int) -> bytes:
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.static.primitive import i16, i32

    from tierproxy.protocol.requests import milliseconds

    request = ProduceRequest(transactional_id=None, acks=i16(1), timeout=milliseconds(10_000), topic_data=(
        TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=i32(0), records=batch(0)),)),))
    return frame(encode_request(request, correlation_id, "channel-test"))


def latest_then_produce(address: tuple[str, int], topic: str) -> tuple[int, int]:
    """ListOffsets(LATEST) and a Produce in one write: (the offset LATEST answered, the
    offset the produced record got)."""
    with socket.create_connection(address) as sock:
        list_offsets = frame(encode_request(
            list_offsets_request({topic: [0]}, OffsetSpec.LATEST), 1, "channel-test"))
        sock.sendall(list_offsets + produce_request(topic, 2))
        first, second = read_frames(sock, 2)
    _, latest = decode_response_frame(ApiKey.LIST_OFFSETS, 7, frame(first))
    _, produced = decode_response_frame(ApiKey.PRODUCE, 9, frame(second))
    produced_partition = produced.responses[0].partition_responses[0]
    assert produced_partition.error_code == 0, produced_partition
    return latest.topics[0].partitions[0].offset, produced_partition.base_offset


@pytest.fixture
def proxy(kafka_cluster) -> Iterator[ProxyThread]:
    thread = ProxyThread(proxy_config(kafka_cluster.bootstrap_servers, 1)).start()
    try:
        yield thread
    finally:
        thread.stop()


def address(proxy: ProxyThread) -> tuple[str, int]:
    host, port = proxy.bootstrap_servers.rsplit(":", 1)
    return host, int(port)


def test_list_offsets_then_produce_in_one_write_sees_the_log_before_the_produce(kafka_cluster, topic, proxy):
    name = topic()
    broker = kafka_cluster.brokers[0][1:]
    latest_then_produce(broker, name)  # the new partition has a leader and a record
    answers = {"broker": [], "proxy": []}
    for _ in range(5):
        for where, to in (("broker", broker), ("proxy", address(proxy))):
            latest, produced_at = latest_then_produce(to, name)
            answers[where].append(latest == produced_at)
    # The broker runs the ListOffsets before the Produce sent after it; so must the proxy.
    assert answers == {"broker": [True] * 5, "proxy": [True] * 5}


def test_malformed_request_is_one_warning_per_connection(kafka_cluster, proxy, caplog):
    # A Fetch v12 whose header is fine and whose body is garbage, 55 bytes in all.
    header = encode_request_header(ApiKey.FETCH, 12, 7, "bad", 2)
    body = header + b"\xff" * (55 - len(header))
    def warnings() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name.startswith("tierproxy.proxy") and r.levelno >= logging.WARNING]

    with caplog.at_level(logging.DEBUG, logger="tierproxy.proxy"):
        for _ in range(10):
            with socket.create_connection(address(proxy)) as sock:
                sock.sendall(frame(body))
                assert closed_by_peer(sock)
        wait_for(lambda: len(warnings()) >= 10, 10, "a warning per closed connection")
    lines = warnings()
    assert len(lines) == 10, [r.getMessage() for r in lines]
    for record in lines:
        assert record.levelno == logging.WARNING and record.exc_info is None
        assert "malformed FETCH v12 request (correlation id 7)" in record.getMessage()
        assert "127.0.0.1:" in record.getMessage()
    assert proxy.metrics.value("tierproxy_connections_closed_total", {"reason": "bad_request"}) == 10


@pytest.fixture
def strict_proxy(kafka_cluster) -> Iterator[ProxyThread]:
    config = proxy_config(kafka_cluster.bootstrap_servers, 1, **{
        "connections.max.idle.ms": 1000, "request.receive.timeout.ms": 1000,
        "max.connections": 5, "max.connections.per.ip": 3})
    thread = ProxyThread(config).start()
    try:
        yield thread
    finally:
        thread.stop()


def test_idle_and_half_sent_connections_are_closed_active_ones_are_not(strict_proxy):
    to = address(strict_proxy)
    idle = socket.create_connection(to)
    slow = socket.create_connection(to)
    active = socket.create_connection(to)
    try:
        slow.sendall(struct.pack(">i", 100) + b"\x00\x12")  # 2 of a 100-byte request
        started = time.monotonic()
        answered = 0
        slow_open = True
        while time.monotonic() - started < 3:
            try:
                if slow_open:
                    slow.send(b"\x00")  # one byte at a time: never idle, never a whole frame
            except OSError:  # closed by the proxy
                slow_open = False
            active.sendall(api_versions(answered))
            answered += len(read_frames(active, 1))
            time.sleep(0.2)
        assert not slow_open or closed_by_peer(slow, 1)
        assert closed_by_peer(idle, 1)
        assert answered >= 5
        active.sendall(api_versions(99))
        assert read_frames(active, 1)[0][:4] == struct.pack(">i", 99)
    finally:
        for sock in (idle, slow, active):
            sock.close()
    assert strict_proxy.metrics.value("tierproxy_connections_closed_total", {"reason": "idle"}) == 1
    assert strict_proxy.metrics.value("tierproxy_connections_closed_total", {"reason": "timeout"}) == 1


def connect_from(source: str, to: tuple[str, int]) -> socket.socket:
    return socket.create_connection(to, source_address=(source, 0))


def test_connection_limits_close_new_connections_at_once(strict_proxy):
    to = address(strict_proxy)
    held = [connect_from("127.0.0.1", to) for _ in range(3)]
    try:
        for sock in held:  # each is served
            sock.sendall(api_versions(1))
            assert read_frames(sock, 1)
        over_ip = connect_from("127.0.0.1", to)
        assert closed_by_peer(over_ip, 5)
        over_ip.close()
        held += [connect_from("127.0.0.2", to) for _ in range(2)]
        for sock in held[3:]:
            sock.sendall(api_versions(2))
            assert read_frames(sock, 1)
        over_total = connect_from("127.0.0.3", to)
        assert closed_by_peer(over_total, 5)
        over_total.close()
        held.pop().close()  # a place frees: a new connection is served again
        deadline = time.monotonic() + 5
        while strict_proxy.server.connection_count > 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        again = connect_from("127.0.0.3", to)
        held.append(again)
        again.sendall(api_versions(3))
        assert read_frames(again, 1)
    finally:
        for sock in held:
            sock.close()
    metrics = strict_proxy.metrics
    assert metrics.value("tierproxy_connections_rejected_total", {"limit": "max.connections.per.ip"}) == 1
    assert metrics.value("tierproxy_connections_rejected_total", {"limit": "max.connections"}) == 1


# --- a SASL listener upstream ------------------------------------------------------------


@pytest.fixture
def sasl_proxy(secure_kafka) -> Iterator[ProxyThread]:
    properties = secure_kafka.tierproxy_properties(mechanism="PLAIN")
    properties["bootstrap.servers"] = secure_kafka.bootstrap_servers
    config = proxy_config(secure_kafka.bootstrap_servers, 1, **properties)
    thread = ProxyThread(config, discover=False).start()
    try:
        yield thread
    finally:
        thread.stop()


def test_fetch_before_sasl_login_closes_the_connection_unanswered(secure_kafka, sasl_proxy):
    from tierproxy.protocol.requests import fetch_request

    user, password = ADMIN_USER, secure_kafka.sasl_plain_users[ADMIN_USER]
    fetch = frame(encode_request(fetch_request("any", 0, 0, 1 << 20), 1, "channel-test"))
    with socket.create_connection(address(sasl_proxy)) as sock:
        sock.sendall(fetch + sasl_handshake("PLAIN", 2) + sasl_plain(user, password, 3))
        assert closed_by_peer(sock)  # no response at all, as the broker does it
    assert sasl_proxy.metrics.value("tierproxy_connections_closed_total", {"reason": "unauthenticated"}) == 1


def test_frames_over_sasl_server_max_receive_size_close_before_login_only(secure_kafka, sasl_proxy):
    user, password = ADMIN_USER, secure_kafka.sasl_plain_users[ADMIN_USER]
    with socket.create_connection(address(sasl_proxy)) as sock:
        sock.sendall(struct.pack(">i", 600 * 1024) + b"\x00" * 1024)
        assert closed_by_peer(sock)
    assert sasl_proxy.metrics.value("tierproxy_connections_closed_total", {"reason": "bad_request"}) == 1

    # After the login the client's frames may be as large as socket.request.max.bytes.
    name = f"big-{time.monotonic_ns()}"
    secure_kafka.create_topic(name)
    producer = Producer({"bootstrap.servers": sasl_proxy.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": password,
                         "message.max.bytes": 1_000_000})
    errors = []
    producer.produce(name, value=b"x" * 600 * 1024, on_delivery=lambda error, _: errors.append(error))
    assert producer.flush(30) == 0 and errors == [None]
    secure_kafka.delete_topic(name)


def _api_versions(address_: tuple[str, int], ca: str | None = None) -> dict[int, tuple[int, int]]:
    """ApiVersions v0 on a new connection (TLS with `ca`), before any login: {api key: (min, max)}."""
    with socket.create_connection(address_) as plain:
        sock = ssl.create_default_context(cafile=ca).wrap_socket(plain, server_hostname=address_[0]) if ca else plain
        sock.sendall(api_versions(1))
        (answer,) = read_frames(sock, 1)
    _, response = decode_response_frame(ApiKey.API_VERSIONS, 0, frame(answer))
    assert response.error_code == 0
    return {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in response.api_keys}


class _MetadataUpToV4(Filter):
    """A filter that reads Metadata only up to v4: the proxy must offer no later version."""

    apis = MappingProxyType({ApiKey.METADATA: range(0, 5)})


def test_a_sasl_client_gets_the_proxys_api_versions_before_it_logs_in(secure_kafka):
    """A SASL client asks ApiVersions once, before its login, and keeps the answer: it must
    be the proxy's ranges (capped where a filter reads fewer versions), not the broker's."""
    properties = secure_kafka.tierproxy_properties(mechanism="PLAIN")
    config = proxy_config(secure_kafka.bootstrap_servers, 1, **properties)
    assert config["security.protocol"].startswith("SASL_")  # every connection behind the SASL gate
    proxy = ProxyThread(config, discover=False, extra_filters=[_MetadataUpToV4()]).start()
    try:
        broker_host, broker_port = secure_kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
        broker = _api_versions((broker_host, int(broker_port)), secure_kafka.client_config().get("ssl.ca.location"))
        proxied = _api_versions(address(proxy))
        filters = proxy.server.services.filters
    finally:
        proxy.stop()
    assert broker[ApiKey.METADATA][1] > 4
    assert proxied[ApiKey.METADATA] == (broker[ApiKey.METADATA][0], 4)
    assert proxied == {api_key: filters.advertised_versions(api_key, *versions) if filters.filters_of(api_key)
                       else versions for api_key, versions in broker.items()}
