"""Pass-through against the real broker: opaque frames come back byte for byte,
acks=0 produce, counters, TLS on both sides, and the `tierproxy serve` command."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import signal
import ssl
import subprocess
import urllib.request
import uuid

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiokafka import AIOKafkaProducer
from confluent_kafka import Producer

from tierproxy.protocol.framing import FrameDecoder, encode_frame
from tierproxy.config.addresses import parse_host_port
from testbed.ports import LOOPBACK, free_ports
from tests.helpers.commands import TIERPROXY
from tests.helpers.consume import consume_aiokafka, consume_confluent
from tests.helpers.proxy import ProxyThread, free_port_block, running_proxy


@pytest.fixture(scope="module")
def proxy(kafka_cluster) -> Iterator[ProxyThread]:
    with running_proxy(kafka_cluster.bootstrap_servers, nodes=1) as proxy:
        yield proxy


async def test_acks_zero_produce_gets_no_response_slot(kafka_cluster, proxy):
    """acks=0 Produce requests are answered by nobody; the requests behind them on the
    same connection must still get their own responses."""
    topic = f"acks0-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, partitions=1)
    try:
        producer = AIOKafkaProducer(bootstrap_servers=proxy.bootstrap_servers, acks=0, linger_ms=0)
        await producer.start()
        try:
            for i in range(50):
                await producer.send_and_wait(topic, value=b"a%d" % i)
            # Requests that do get a response still get theirs.
            assert await producer.partitions_for(topic) == {0}
        finally:
            await producer.stop()
        records = await consume_aiokafka(proxy.bootstrap_servers, topic, 50)
        assert [r.value for r in records] == [b"a%d" % i for i in range(50)]
    finally:
        kafka_cluster.delete_topic(topic)


def test_confluent_producer_and_metrics(kafka_cluster, proxy, topic):
    """librdkafka produces through the proxy; the counters see the traffic."""
    name = topic(partitions=2)
    producer = Producer({"bootstrap.servers": proxy.bootstrap_servers, "linger.ms": 5})
    errors: list[Any] = []
    for i in range(100):
        producer.produce(name, key=b"k%d" % i, value=b"v%d" % i,
                         on_delivery=lambda err, msg: errors.append(err) if err else None)
    assert producer.flush(30) == 0
    assert errors == []
    messages = consume_confluent(proxy.bootstrap_servers, name, 100)
    assert sorted(m.value() for m in messages) == sorted(b"v%d" % i for i in range(100))
    metrics = proxy.metrics
    produce = {"api": "PRODUCE"}
    assert (metrics.value("tierproxy_requests_forwarded_total", produce)
            + metrics.value("tierproxy_requests_intercepted_total", produce)) >= 1
    assert metrics.value("tierproxy_requests_intercepted_total", {"api": "METADATA"}) >= 1
    assert metrics.value("tierproxy_connections_total", {"listener": "bootstrap"}) >= 1
    assert metrics.value("tierproxy_connections_total", {"listener": "node-0"}) >= 1
    assert metrics.value("tierproxy_client_bytes_in_total") > 0
    assert metrics.value("tierproxy_client_bytes_out_total") > 0


async def test_forwarded_frames_are_byte_for_byte_the_brokers(kafka_cluster, proxy, topic):
    """A pass-through API (DescribeConfigs) gets the broker's exact response bytes,
    correlation id included, whether asked directly or through the proxy."""
    from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource
    from kio.static.primitive import i8

    from tierproxy.protocol.codecs import encode_request

    name = topic()
    request = DescribeConfigsRequest(
        resources=(DescribeConfigsResource(resource_type=i8(2), resource_name=name, configuration_keys=None),),
        include_synonyms=True, include_documentation=False)
    frame = encode_frame(encode_request(request, 0x7FFFFFF0, "byte-for-byte"))
    (_, host, port), = kafka_cluster.brokers
    direct = await _exchange(host, port, frame)
    proxied = await _exchange(*parse_host_port(proxy.bootstrap_servers), frame)
    assert proxied == direct
    assert direct[:4] == b"\x7f\xff\xff\xf0"


async def _exchange(host: str, port: int, frame: list[bytes]) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.writelines(frame)
        decoder = FrameDecoder()
        while True:
            data = await asyncio.wait_for(reader.read(65536), 10)
            assert data, "connection closed"
            bodies = decoder.feed(data)
            if bodies:
                return bytes(bodies[0])
    finally:
        writer.close()


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tierproxy-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(LOOPBACK)),
                                                    x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "proxy.pem", tmp_path / "proxy.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_tls_to_clients_and_to_brokers(kafka_cluster, topic, tmp_path):
    """Proxy A serves TLS; proxy B reaches A as its (TLS) broker. A client of B, and a
    TLS client of A, both produce and consume."""
    cert, key = _self_signed(tmp_path)
    name = topic()
    with running_proxy(kafka_cluster.bootstrap_servers, 1, **{
            "proxy.ssl.certificate.location": cert, "proxy.ssl.key.location": key}) as tls_proxy:
        with running_proxy(tls_proxy.bootstrap_servers, 1, **{
                "security.protocol": "SSL", "ssl.ca.location": cert}) as chained:
            context = ssl.create_default_context(cafile=str(cert))
            producer = AIOKafkaProducer(bootstrap_servers=tls_proxy.bootstrap_servers, security_protocol="SSL",
                                        ssl_context=context)
            await producer.start()
            try:
                await producer.send_and_wait(name, b"over-tls", partition=0)
            finally:
                await producer.stop()
            producer = AIOKafkaProducer(bootstrap_servers=chained.bootstrap_servers)
            await producer.start()
            try:
                await producer.send_and_wait(name, b"through-both", partition=0)
            finally:
                await producer.stop()
            records = await consume_aiokafka(chained.bootstrap_servers, name, 2)
            assert [r.value for r in records] == [b"over-tls", b"through-both"]
            records = await consume_aiokafka(tls_proxy.bootstrap_servers, name, 2, security_protocol="SSL",
                                             ssl_context=context)
            assert [r.value for r in records] == [b"over-tls", b"through-both"]
            assert chained.metrics.value("tierproxy_connections_closed_total", {"reason": "broker_unreachable"}) == 0


def test_serve_command_serves_and_stops_on_sigterm(kafka_cluster, topic, tmp_path):
    name = topic()
    base = free_port_block(1)
    bootstrap_port, metrics_port = free_ports(2)
    config = tmp_path / "proxy.properties"
    config.write_text(f"bootstrap.servers={kafka_cluster.bootstrap_servers}\n"
                      f"proxy.bootstrap.port={bootstrap_port}\nproxy.broker.port.base={base}\n")
    process = subprocess.Popen(
        [str(TIERPROXY), "serve", "--config", str(config),
         "--override", f"metrics.port={metrics_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            if "tierproxy serving on" in line:
                break
        else:
            pytest.fail("serve exited before serving:\n" + "".join(output))
        producer = Producer({"bootstrap.servers": f"{LOOPBACK}:{bootstrap_port}"})
        producer.produce(name, b"served", partition=0)
        assert producer.flush(30) == 0
        messages = consume_confluent(f"{LOOPBACK}:{bootstrap_port}", name, 1)
        assert [m.value() for m in messages] == [b"served"]
        with urllib.request.urlopen(f"http://{LOOPBACK}:{metrics_port}/metrics", timeout=10) as response:
            exposition = response.read().decode()
        assert 'tierproxy_connections_total{listener="node-0"}' in exposition
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=30)
        output.append(rest)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, "".join(output)
    assert "stopped" in output[-1]
