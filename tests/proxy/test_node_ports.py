"""Node ids to ports and advertised hosts for real clusters, against real brokers.

- A broker whose node id is 1001 behind `proxy.broker.node.id.range=1000-1099` listens on
  `proxy.broker.port.start + 1` (not `proxy.broker.port.base + 1001`); librdkafka and the
  Java console consumer produce and consume through it.
- `proxy.broker.port.map` with `proxy.advertised.host.pattern`: every response naming a
  broker names its own host and the mapped port.
- A node the configuration gives no port (the third broker of three, mapped two): it is
  never named to clients, its error is logged once; librdkafka and a Java consumer group
  read every partition the other two lead, and a group it coordinates gets
  COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.describe_cluster.v0.request import DescribeClusterRequest
from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.static.primitive import i8

from tierproxy.client.connection import KafkaConnection
from tierproxy.config.addresses import parse_host_port
from tierproxy.protocol.apis import ErrorCode
from testbed.fixtures import DEFAULT_SEGMENT_BYTES
from testbed.kafka import KafkaCluster
from tests.helpers.proxy import ProxyThread, free_port_block, proxy_config

NODE = 1001
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster_1001() -> Iterator[KafkaCluster]:
    with KafkaCluster(1, first_node_id=NODE, broker_config={"log.segment.bytes": DEFAULT_SEGMENT_BYTES}) as cluster:
        yield cluster


def _produce(cluster_config: dict[str, str], topic: str, partitions: int, per_partition: int) -> list[tuple]:
    producer = Producer({**cluster_config, "linger.ms": 5})
    produced: list[tuple] = []
    for i in range(per_partition):
        for partition in range(partitions):
            producer.produce(topic, key=f"{partition}-{i}".encode(), value=b"v" * 100, partition=partition,
                             on_delivery=lambda err, msg: produced.append(
                                 (msg.partition(), msg.offset(), msg.key())) if err is None else None)
    assert producer.flush(30) == 0
    return sorted(produced)


def _consume_assigned(bootstrap: str, topic: str, partitions: list[int], count: int,
                      timeout_s: float = 60) -> list[tuple]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    consumed: list[tuple] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(consumed) < count and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.2):
                if message.error() is None:
                    consumed.append((message.partition(), message.offset(), message.key()))
    finally:
        consumer.close()
    return sorted(consumed)


def _console_consumer(cluster: KafkaCluster, bootstrap: str, topic: str, count: int, *args: str) -> list[tuple]:
    result = cluster.java_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap, "--topic", topic,
        "--from-beginning", "--max-messages", str(count), "--timeout-ms", "60000", *args,
        "--property", "print.key=true", "--property", "print.value=false",
        "--property", "print.partition=true", "--property", "print.offset=true", timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    got = []
    for line in result.stdout.splitlines():
        if line.startswith("Partition:"):
            partition, offset, key = line.split("\t")[:3]
            got.append((int(partition.split(":")[1]), int(offset.split(":")[1]), key.encode()))
    return sorted(got)


async def _metadata(bootstrap: str, topic: str | None = None):  # type: ignore[no-untyped-def]
    topics = None if topic is None else (MetadataRequestTopic(topic_id=None, name=topic),)
    async with await KafkaConnection.open(*parse_host_port(bootstrap)) as connection:
        return await connection.request(MetadataRequest(topics=topics, allow_auto_topic_creation=False,
                                                        include_topic_authorized_operations=False))


def test_node_1001_listens_on_its_place_in_the_node_id_range(cluster_1001):
    start = free_port_block(2)
    config = proxy_config(cluster_1001.bootstrap_servers, 1, **{
        "proxy.broker.node.id.range": "1000-1099", "proxy.broker.port.start": start})
    proxy = ProxyThread(config).start()
    try:
        assert proxy.call(lambda: proxy.server.node_listeners) == {NODE: ("127.0.0.1", start + 1)}
        topic = f"ids-{uuid.uuid4().hex[:8]}"
        cluster_1001.create_topic(topic, partitions=2)
        produced = _produce({"bootstrap.servers": proxy.bootstrap_servers}, topic, 2, 50)
        assert len(produced) == 100
        assert _consume_assigned(proxy.bootstrap_servers, topic, [0, 1], 100) == produced
        assert _console_consumer(cluster_1001, proxy.bootstrap_servers, topic, 100) == produced
        assert proxy.metrics.value("tierproxy_connections_total", {"listener": f"node-{NODE}"}) >= 2
        cluster_1001.delete_topic(topic)
    finally:
        proxy.stop()


async def test_a_port_map_and_a_host_pattern_name_every_broker(cluster_1001):
    port = free_port_block(1)
    config = proxy_config(cluster_1001.bootstrap_servers, 1, **{
        "proxy.broker.port.map": f"{NODE}:{port}",
        "proxy.advertised.host.pattern": "broker-$(nodeId).kafka.example.com"})
    proxy = ProxyThread(config).start()
    try:
        expected = {NODE: (f"broker-{NODE}.kafka.example.com", port)}
        assert proxy.call(lambda: proxy.server.node_listeners) == expected
        # The bootstrap address keeps proxy.advertised.host (here proxy.listener.host).
        assert proxy.bootstrap_servers.startswith("127.0.0.1:")
        metadata = await _metadata(proxy.bootstrap_servers)
        assert {b.node_id: (b.host, b.port) for b in metadata.brokers} == expected
        async with await KafkaConnection.open(*parse_host_port(proxy.bootstrap_servers)) as connection:
            cluster = await connection.request(DescribeClusterRequest(include_cluster_authorized_operations=False))
            group = f"g-{uuid.uuid4().hex[:8]}"
            deadline = time.monotonic() + 30
            while True:  # the offsets topic may still be loading
                (coordinator,) = (await connection.request(FindCoordinatorRequest(
                    key_type=i8(0), coordinator_keys=(group,)))).coordinators
                if coordinator.error_code == ErrorCode.none or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
        assert {b.broker_id: (b.host, b.port) for b in cluster.brokers} == expected
        assert (coordinator.node_id, coordinator.host, coordinator.port) == (NODE, *expected[NODE])
    finally:
        proxy.stop()


# --- a node without a port -----------------------------------------------------------------


@pytest.fixture(scope="module")
def two_of_three(kafka_cluster_3) -> Iterator[ProxyThread]:
    """A proxy mapping nodes 0 and 1 of the three, learning nodes from clients only."""
    ports = free_port_block(2)
    config = proxy_config(kafka_cluster_3.bootstrap_servers, 3, **{
        "proxy.broker.port.map": f"0:{ports},1:{ports + 1}"})
    proxy = ProxyThread(config, discover=False).start()
    yield proxy
    proxy.stop()


async def _group_coordinated_by(cluster: KafkaCluster, wanted: set[int]) -> str:
    """A group id whose coordinator, asked of the cluster itself, is one of the `wanted` nodes."""
    async with await KafkaConnection.open(*parse_host_port(cluster.bootstrap_servers.split(",")[0])) as conn:
        for _ in range(200):
            group = f"g-{uuid.uuid4().hex[:8]}"
            (answer,) = (await conn.request(FindCoordinatorRequest(key_type=i8(0),
                                                                   coordinator_keys=(group,)))).coordinators
            if answer.error_code == ErrorCode.none and answer.node_id in wanted:
                return group
    raise AssertionError(f"no group coordinated by {wanted}")


def test_a_node_without_a_port_is_never_named_and_the_others_are_served(kafka_cluster_3, two_of_three, caplog):
    topic = f"unmapped-{uuid.uuid4().hex[:8]}"
    kafka_cluster_3.create_topic(topic, partitions=6)
    try:
        produced = _produce(kafka_cluster_3.client_config(), topic, 6, 20)
        leaders = {p: m.leader for p, m in
                   kafka_cluster_3.admin().list_topics(topic, timeout=30).topics[topic].partitions.items()}
        assert set(leaders.values()) == {0, 1, 2}, leaders
        served = [p for p, leader in leaders.items() if leader != 2]
        expected = [r for r in produced if r[0] in served]
        with caplog.at_level(logging.ERROR, logger="tierproxy.proxy.server"):
            # librdkafka, every partition assigned: those led by node 0 and 1 in full, none of node 2's.
            consumed = _consume_assigned(two_of_three.bootstrap_servers, topic, list(range(6)), len(produced),
                                         timeout_s=15)
            assert consumed == expected
            # A Java consumer group (coordinated by node 0 or 1) reads the same, node 2's partitions
            # waiting for a leader.
            group = asyncio.run(_group_coordinated_by(kafka_cluster_3, {0, 1}))
            java = _console_consumer(kafka_cluster_3, two_of_three.bootstrap_servers, topic, len(expected),
                                     "--group", group)
            assert java == expected
        errors = [r.getMessage() for r in caplog.records if "broker node 2" in r.getMessage()]
        assert len(errors) == 1, errors  # once, however many responses named it
        assert re.search(r"broker node 2 \(127\.0\.0\.1:\d+\) has no proxy port in proxy\.broker\.port\.map=0:\d+,"
                         r"1:\d+", errors[0]), errors
        metadata = asyncio.run(_metadata(two_of_three.bootstrap_servers, topic))
        assert sorted(b.node_id for b in metadata.brokers) == [0, 1]
        assert {p.partition_index: p.leader_id for t in metadata.topics for p in t.partitions} == leaders
    finally:
        kafka_cluster_3.delete_topic(topic)


async def test_a_group_coordinated_by_a_node_without_a_port_gets_coordinator_not_available(
        kafka_cluster_3, two_of_three):
    group = await _group_coordinated_by(kafka_cluster_3, {2})
    async with await KafkaConnection.open(*parse_host_port(two_of_three.bootstrap_servers)) as connection:
        (coordinator,) = (await connection.request(FindCoordinatorRequest(
            key_type=i8(0), coordinator_keys=(group,)))).coordinators
    assert (coordinator.error_code, coordinator.node_id, coordinator.host, coordinator.port) == (
        ErrorCode.coordinator_not_available, -1, "", -1)
    assert "broker node 2 has no tierproxy listener" in coordinator.error_message


# --- TLS names -------------------------------------------------------------------------------


def _certificate(tmp_path, dns: list[str], ips: list[str]) -> str:  # type: ignore[no-untyped-def]
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tierproxy-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    alternatives = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
                   .sign(key, hashes.SHA256()))
    path = tmp_path / "proxy.pem"
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(path)


def test_certificate_names_cover_hosts_as_clients_check_them(tmp_path):
    from tierproxy.config import parse
    from tierproxy.proxy.tls import CertificateNames

    path = _certificate(tmp_path, ["kafka.example.com", "*.kafka.example.com"], ["127.0.0.1"])
    names = CertificateNames.of(parse({"bootstrap.servers": "b:9092", "proxy.ssl.certificate.location": path}))
    assert names is not None
    assert names.covers("kafka.example.com") and names.covers("Broker-1001.Kafka.Example.COM")
    assert names.covers("127.0.0.1")
    assert not names.covers("a.broker-1001.kafka.example.com")  # a wildcard is one label
    assert not names.covers("example.com") and not names.covers("127.0.0.2") and not names.covers("localhost")
    assert CertificateNames.of(parse({"bootstrap.servers": "b:9092"})) is None


def test_a_broker_name_the_certificate_does_not_cover_is_warned_about_once(kafka_cluster, tmp_path, caplog):
    path = _certificate(tmp_path, ["localhost", "*.kafka.example.com"], ["127.0.0.1"])
    config = proxy_config(kafka_cluster.bootstrap_servers, 1, **{
        "proxy.ssl.certificate.location": path,
        "proxy.advertised.host.pattern": "broker-$(nodeId).kafka.example.org"})
    with caplog.at_level(logging.WARNING, logger="tierproxy.proxy.server"):
        ProxyThread(config).start().stop()
    warnings = [r.getMessage() for r in caplog.records if "does not name" in r.getMessage()]
    assert len(warnings) == 1, warnings  # the bootstrap's 127.0.0.1 is named; broker 0's host is not
    assert "does not name broker-0.kafka.example.org, the host clients are told for broker node 0" in warnings[0]
    assert "DNS:*.kafka.example.com" in warnings[0]
