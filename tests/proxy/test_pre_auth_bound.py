"""The pre-authentication bound in front of a SASL listener, whatever `security.protocol`
says (it is the setting of the proxy's own connections): frames above
`sasl.server.max.receive.size` before a login close the connection unread, while real
SASL clients log in and consume through the proxy, and a plaintext listener still takes
large frames, also as a connection's very first request.

The proxy here has `security.protocol=PLAINTEXT` in front of the testbed's SASL_PLAINTEXT
listener: it learns that the listener wants SASL from its own Metadata request, which the
broker refuses without a login (at start-up, or when the first client connects).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i16, i32

from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.codecs import decode_response_frame, encode_request
from tierproxy.protocol.headers import encode_request_header
from tierproxy.protocol.requests import milliseconds
from testbed.kafka import ADMIN_USER
from testbed.ports import LOOPBACK, free_ports
from testbed.raw import api_versions, closed_by_peer, frame, read_frames
from tests.helpers.batches import batch
from tests.helpers.proxy import ProxyThread, free_port_block, proxy_config
from tests.helpers.serve import Served, sample, scrape, start_serving

MIB = 1024 * 1024
BIG = 20 * MIB
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def served(sasl_kafka, tmp_path_factory) -> Iterator[tuple[Served, int, int]]:
    """`tierproxy serve` (one process: its memory is the proxy's) with security.protocol
    PLAINTEXT, in front of the SASL listener."""
    bootstrap_port, metrics_port = free_ports(2)
    settings = {"bootstrap.servers": sasl_kafka.bootstrap_servers, "proxy.listener.host": LOOPBACK,
                "proxy.bootstrap.port": bootstrap_port, "proxy.broker.port.base": free_port_block(1),
                "metrics.port": metrics_port, "proxy.workers": 1}
    directory = tmp_path_factory.mktemp("pre-auth")
    settings["remote.log.storage.local.dir"] = directory / "remote"
    settings["remote.log.metadata.dir"] = directory / "metadata"
    proxy = start_serving(settings, directory)
    try:
        proxy.wait_for("tierproxy serving on")
        yield proxy, bootstrap_port, metrics_port
    finally:
        assert proxy.stop() == 0, proxy.output


def _memory_kib(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.M).group(1))


def _send_big_frame(address: tuple[str, int], size: int) -> bool:
    """A frame announcing `size` bytes, sent whole unless the peer closes first; whether
    the peer closed the connection without a byte of answer."""
    with socket.create_connection(address) as sock:
        sock.sendall(api_versions(1))
        read_frames(sock, 1)
        try:
            sock.sendall(struct.pack(">i", size) + os.urandom(1024) * (size // 1024))
        except OSError:  # reset by the proxy part way through: it read no more
            return True
        return closed_by_peer(sock)


def test_frames_over_the_bound_before_a_login_are_refused_and_never_held(served):
    proxy, bootstrap_port, metrics_port = served
    assert "the brokers' listener wants SASL" in proxy.output, proxy.output
    pid = proxy.process.pid
    peak_before = _memory_kib(pid, "VmHWM")
    for _ in range(3):
        assert _send_big_frame((LOOPBACK, bootstrap_port), BIG)
    proxy.wait_for(r"closing: bad frame \(before authentication, sasl\.server\.max\.receive\.size\): "
                   rf"frame size {BIG} exceeds the maximum of 524288 bytes", 3)
    # The proxy read no frame: its peak memory did not grow by one of their size, let alone three.
    grown_kib = _memory_kib(pid, "VmHWM") - peak_before
    assert grown_kib * 1024 < BIG, grown_kib
    assert sample(scrape(metrics_port), 'tierproxy_connections_closed_total{reason="bad_request"}') == 3


def _sasl(user: str = ADMIN_USER, password: str = "admin-secret") -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": password}


def test_sasl_clients_log_in_and_consume_through_the_proxy(sasl_kafka, served):
    _, bootstrap_port, _ = served
    bootstrap = f"{LOOPBACK}:{bootstrap_port}"
    topic = f"logins-{uuid.uuid4().hex[:8]}"
    sasl_kafka.create_topic(topic, partitions=2)
    try:
        # After the login a frame may be as large as socket.request.max.bytes: a 600 KiB record.
        producer = Producer({"bootstrap.servers": bootstrap, **_sasl(), "linger.ms": 5,
                             "message.max.bytes": 1_000_000})
        errors: list = []
        values = {i: (b"x" * 600 * 1024 if i == 7 else b"v%d" % i) for i in range(40)}
        for i, value in values.items():
            producer.produce(topic, key=b"k%d" % i, value=value, partition=i % 2,
                             on_delivery=lambda error, _message: errors.append(error))
        assert producer.flush(30) == 0 and errors == [None] * len(values)

        consumer = Consumer({"bootstrap.servers": bootstrap, **_sasl(), "group.id": f"g-{uuid.uuid4().hex[:8]}",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe([topic])
        got: dict[bytes, bytes] = {}
        try:
            deadline = time.monotonic() + 60
            while len(got) < len(values) and time.monotonic() < deadline:
                for message in consumer.consume(100, timeout=0.5):
                    if message.error() is None:
                        got[message.key()] = message.value()
        finally:
            consumer.close()
        assert got == {b"k%d" % i: value for i, value in values.items()}

        # The Java console consumer, with the client properties Kafka's tools take.
        result = sasl_kafka.java_tool(
            "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap,
            "--consumer.config", str(sasl_kafka.client_properties(ADMIN_USER)), "--topic", topic,
            "--from-beginning", "--max-messages", str(len(values)), "--timeout-ms", "60000",
            "--property", "print.key=true", "--property", "print.value=false", timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        assert sorted(line for line in result.stdout.splitlines() if line.startswith("k")) == \
            sorted(f"k{i}" for i in values)
    finally:
        sasl_kafka.delete_topic(topic)


def test_without_start_up_knowledge_the_first_connection_waits_for_the_proxy_to_ask(sasl_kafka, caplog):
    config = proxy_config(sasl_kafka.bootstrap_servers, 1)
    with caplog.at_level(logging.INFO, logger="tierproxy.proxy"):
        proxy = ProxyThread(config, discover=False).start()
        try:
            host, port = proxy.bootstrap_servers.rsplit(":", 1)
            assert _send_big_frame((host, int(port)), BIG)
        finally:
            proxy.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert any("the brokers' listener wants SASL" in m and "refused Metadata without a login" in m
               for m in messages), messages


# --- a plaintext listener ------------------------------------------------------------------


def _produce_frame(topic: str, value_size: int, correlation_id: int) -> bytes:
    request = ProduceRequest(transactional_id=None, acks=i16(1), timeout=milliseconds(30_000), topic_data=(
        TopicProduceData(name=topic, partition_data=(
            PartitionProduceData(index=i32(0), records=batch(0, 1, value_size=value_size)),)),))
    return frame(encode_request(request, correlation_id, "pre-auth-test"))


def _produce_first(address: tuple[str, int], topic: str, value_size: int) -> int:
    """A large Produce as the connection's very first request; the partition's error code."""
    with socket.create_connection(address) as sock:
        sock.sendall(_produce_frame(topic, value_size, 5))
        (answer,) = read_frames(sock, 1, timeout=30)
    _, response = decode_response_frame(ApiKey.PRODUCE, 9, frame(answer))
    return response.responses[0].partition_responses[0].error_code


@pytest.mark.parametrize("discover", [True, False], ids=["known-at-start-up", "asked-at-first-connection"])
def test_a_plaintext_listener_still_takes_large_frames(kafka_cluster, topic, discover):
    name = topic(config={"max.message.bytes": 4 * MIB})
    proxy = ProxyThread(proxy_config(kafka_cluster.bootstrap_servers, 1), discover=discover).start()
    try:
        host, port = proxy.bootstrap_servers.rsplit(":", 1)
        assert _produce_first((host, int(port)), name, 900 * 1024) == 0
    finally:
        proxy.stop()


def test_a_broker_refusing_a_first_request_makes_the_proxy_ask_again(kafka_cluster, topic, caplog):
    """A request the broker cannot parse is closed unanswered, as a SASL listener closes a
    client that skips the login: until it asked the brokers again, the proxy holds new
    connections to the bound; asked, it knows the listener takes large frames again."""
    name = topic(config={"max.message.bytes": 4 * MIB})
    proxy = ProxyThread(proxy_config(kafka_cluster.bootstrap_servers, 1)).start()
    try:
        host, port = proxy.bootstrap_servers.rsplit(":", 1)
        address = (host, int(port))
        with caplog.at_level(logging.INFO, logger="tierproxy.proxy"):
            with socket.create_connection(address) as sock:  # CreateTopics v7 (passed through) of garbage
                sock.sendall(frame(encode_request_header(ApiKey.CREATE_TOPICS, 7, 3, "garbage", 2) + b"\xff" * 40))
                assert closed_by_peer(sock)
            assert _produce_first(address, name, 900 * 1024) == 0
        messages = [r.getMessage() for r in caplog.records]
        assert any("its listener may want SASL now" in m for m in messages), messages
        assert any("answered Metadata without a login" in m for m in messages), messages
    finally:
        proxy.stop()
