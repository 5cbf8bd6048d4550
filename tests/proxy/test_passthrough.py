"""Pass-through against the real broker: opaque frames come back byte for byte,
acks=0 produce, counters, TLS on both sides, and the `tierproxy serve` command.

The helpers here (imported by the other proxy test modules) run the proxy on uvloop
in a thread of its own, as `tierproxy serve` runs it, so that blocking clients
(confluent-kafka, kcat, the Java console consumer) and aiokafka in the test's own
event loop can all use it.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import random
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, Producer

from tierproxy.protocol.framing import FrameDecoder, encode_frame
from tierproxy.config import Config, parse
from tierproxy.proxy.metrics import ProxyMetrics
from tierproxy.proxy.serve import build_filters
from tierproxy.config.addresses import parse_host_port
from tierproxy.proxy.server import ProxyServer
from testbed.ports import free_ports
from tests.helpers.produce import ProducedRecord

LOOPBACK = "127.0.0.1"


# --- helpers shared by the proxy tests ------------------------------------------------


def free_port_block(count: int, attempts: int = 50) -> int:
    """A base port such that base .. base+count-1 are free now (the node listeners)."""
    for _ in range(attempts):
        base = random.randrange(20000, 60000 - count)
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((LOOPBACK, port))
                sockets.append(sock)
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no block of {count} free ports found")


def proxy_config(bootstrap: str, nodes: int = 3, **overrides: Any) -> Config:
    """Proxy settings on loopback: an ephemeral bootstrap port, node ports free now."""
    properties = {
        "bootstrap.servers": bootstrap,
        "proxy.listener.host": LOOPBACK,
        "proxy.bootstrap.port": "0",
        "proxy.broker.port.base": str(free_port_block(nodes)),
        "metrics.port": "0",
    }
    # Keys may be given as keyword-friendly names: socket_request_max_bytes.
    properties.update({key.replace("_", "."): str(value) for key, value in overrides.items()})
    return parse(properties)


class ProxyThread:
    """A ProxyServer on its own uvloop event loop in a background thread."""

    def __init__(self, config: Config, metrics: ProxyMetrics | None = None, *, discover: bool = True) -> None:
        self.config = config
        self.discover = discover
        self.metrics = metrics if metrics is not None else ProxyMetrics()
        self.server: ProxyServer | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="tierproxy", daemon=True)

    def _run(self) -> None:
        import uvloop

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            server = ProxyServer(self.config, build_filters(self.config, self.metrics), self.metrics)
            try:
                await server.start(discover=self.discover)
                self.server = server
                self._ready.set()
                await self._stop.wait()
            finally:
                await server.close()

        try:
            uvloop.run(main())
        except BaseException as e:  # reported by start()
            self._error = e
        finally:
            self._ready.set()

    def start(self) -> ProxyThread:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None or self.server is None:
            raise RuntimeError("proxy did not start") from self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert not self._thread.is_alive(), "proxy thread did not stop"

    @property
    def bootstrap_servers(self) -> str:
        assert self.server is not None
        return self.server.bootstrap_servers

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the proxy's loop and return its result (thread-safe)."""
        assert self._loop is not None
        done: asyncio.Future = asyncio.run_coroutine_threadsafe(_call(fn, *args), self._loop)  # type: ignore[assignment]
        return done.result(30)


async def _call(fn: Any, *args: Any) -> Any:
    return fn(*args)


@contextmanager
def running_proxy(bootstrap: str, nodes: int = 3, **overrides: Any) -> Iterator[ProxyThread]:
    proxy = ProxyThread(proxy_config(bootstrap, nodes, **overrides)).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def record_key(record: Any) -> tuple:
    """What a consumed record must equal of its ProducedRecord."""
    return (record.partition, record.offset, record.key, record.value)


def expected_keys(produced: list[ProducedRecord], *, read_committed: bool = False) -> list[tuple]:
    return [(r.partition, r.offset, r.key, r.value) for r in produced if r.committed or not read_committed]


async def consume_aiokafka(bootstrap: str, topic: str, count: int, **kwargs: Any) -> list[Any]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, **kwargs)
    await consumer.start()
    records: list[Any] = []
    try:
        deadline = time.monotonic() + 60
        while len(records) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for batch in batches.values():
                records.extend(batch)
    finally:
        await consumer.stop()
    return records


def consume_confluent(bootstrap: str, topic: str, count: int, **config: Any) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, **config})
    consumer.subscribe([topic])
    records: list[Any] = []
    try:
        deadline = time.monotonic() + 60
        while len(records) < count and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is None:
                    records.append(message)
    finally:
        consumer.close()
    return records


def confluent_key(message: Any) -> tuple:
    return (message.partition(), message.offset(), message.key(), message.value())


# --- the tests -------------------------------------------------------------------------


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
        [str(Path(sys.executable).parent / "tierproxy"), "serve", "--config", str(config),
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
