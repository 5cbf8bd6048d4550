"""The secured testbed cluster: SASL_SSL (SCRAM, PLAIN), mutual TLS, the CA, the helpers."""

from __future__ import annotations

import json
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import javaproperties
import pytest
from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition)
from confluent_kafka.admin import AclOperation, ResourceType
from cryptography import x509
from cryptography.x509.oid import NameOID

from testbed import probe
from testbed.fixtures import SECURE_USERS, Topics
from testbed.kafka import SECURE_MECHANISMS, KafkaCluster
from testbed.processes import is_alive, pids_running
from tests.helpers.acl import grant
from tests.helpers.testbed_cli import run_testbed, up

pytestmark = pytest.mark.timeout(180)


def _allow(cluster: KafkaCluster, user: str, topic: str, group: str) -> None:
    """All operations on ``topic`` and ``group`` for ``user``, once the authorizer has them."""
    grant(cluster, user, ResourceType.TOPIC, topic, AclOperation.ALL)
    grant(cluster, user, ResourceType.GROUP, group, AclOperation.ALL)


def _produce(config: dict[str, str], topic: str, values: list[bytes]) -> list[KafkaError]:
    errors: list[KafkaError] = []
    producer = Producer({**config, "message.timeout.ms": 15_000})
    for value in values:
        producer.produce(topic, value, on_delivery=lambda err, _msg: err and errors.append(err))
    assert producer.flush(20) == 0
    return errors


def _consume(config: dict[str, str], topic: str, count: int, group: str) -> list[bytes]:
    consumer = Consumer({**config, "group.id": group, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    received: list[bytes] = []
    deadline = time.monotonic() + 20
    try:
        while len(received) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                received.append(message.value())
    finally:
        consumer.close()
    return received


def _connection_errors(config: dict[str, Any], timeout: float = 15.0) -> dict[int, str]:
    """What librdkafka reports (error_cb) while it fails to reach the cluster: code -> message."""
    errors: list[KafkaError] = []
    producer = Producer({**config, "error_cb": errors.append, "reconnect.backoff.ms": 200})
    with pytest.raises(KafkaException):
        producer.list_topics(timeout=1.5)
    deadline = time.monotonic() + timeout
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    producer.poll(0)
    return {e.code(): e.str() for e in errors}


@pytest.mark.parametrize("mechanism", SECURE_MECHANISMS)
def test_sasl_ssl_accepts_every_mechanism(secure_kafka: KafkaCluster, secure_topic: Topics,
                                          mechanism: str) -> None:
    name = secure_topic()
    group = f"alice-{name}"
    _allow(secure_kafka, "alice", name, group)
    config = secure_kafka.client_config("alice", mechanism)
    assert config["sasl.mechanism"] == mechanism and config["security.protocol"] == "SASL_SSL"
    values = [f"{mechanism}-{i}".encode() for i in range(5)]
    assert _produce(config, name, values) == []
    assert _consume(config, name, len(values), group) == values


def test_users_without_acls_are_refused(secure_kafka: KafkaCluster, secure_topic: Topics) -> None:
    name = secure_topic()
    [error] = _produce(secure_kafka.client_config("bob"), name, [b"v"])
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_wrong_password_is_an_authentication_error(secure_kafka: KafkaCluster,
                                                   mechanism: str) -> None:
    config = {**secure_kafka.client_config("alice", mechanism), "sasl.password": "wrong"}
    errors = _connection_errors(config)
    assert KafkaError._AUTHENTICATION in errors, errors
    assert ("invalid credentials" in errors[KafkaError._AUTHENTICATION]
            or "Invalid username or password" in errors[KafkaError._AUTHENTICATION])


def test_client_trusting_another_ca_is_refused(secure_kafka: KafkaCluster) -> None:
    config = {**secure_kafka.client_config("alice"), "ssl.ca.location": str(secure_kafka.tls.other_ca)}
    errors = _connection_errors(config)
    assert "certificate verify failed" in errors.get(KafkaError._SSL, ""), errors


def test_broker_certificate_names_loopback(secure_kafka: KafkaCluster) -> None:
    tls = secure_kafka.tls
    [(_, host, port)] = secure_kafka.brokers
    for server_hostname in ("127.0.0.1", "localhost"):
        context = ssl.create_default_context(cafile=str(tls.ca))
        with socket.create_connection((host, port), timeout=5) as sock, \
                context.wrap_socket(sock, server_hostname=server_hostname) as tls_sock:
            assert tls_sock.version() in ("TLSv1.2", "TLSv1.3")
    context = ssl.create_default_context(cafile=str(tls.other_ca))
    with socket.create_connection((host, port), timeout=5) as sock, \
            pytest.raises(ssl.SSLCertVerificationError):
        context.wrap_socket(sock, server_hostname=host)
    client = x509.load_pem_x509_certificate(tls.client_cert.read_bytes())
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "tierproxy"
    assert client.issuer == x509.load_pem_x509_certificate(tls.ca.read_bytes()).subject
    # The readiness probe speaks plaintext; it never gets an answer on the TLS port.
    assert not probe.answers(host, port, timeout=1.0)


def test_mtls_listener_accepts_the_client_certificate(secure_kafka: KafkaCluster,
                                                      secure_topic: Topics) -> None:
    name = secure_topic()  # no ACLs: User:tierproxy (the certificate's CN) is a super user
    config = secure_kafka.mtls_client_config()
    values = [f"mtls-{i}".encode() for i in range(5)]
    assert _produce(config, name, values) == []
    assert _consume(config, name, len(values), f"mtls-{name}") == values
    # Each listener advertises itself: Metadata answers in the connection's listener.
    [(node_id, host, client_port)] = secure_kafka.brokers
    mtls_port = secure_kafka.listener_ports[node_id]["MTLS"]
    assert secure_kafka.mtls_bootstrap_servers == f"{host}:{mtls_port}"
    for client, port in ((Producer(config), mtls_port),
                         (Producer(secure_kafka.client_config("alice")), client_port)):
        brokers = client.list_topics(timeout=10).brokers
        assert {(b.id, b.host, b.port) for b in brokers.values()} == {(node_id, host, port)}


def test_mtls_listener_rejects_a_client_without_certificate(secure_kafka: KafkaCluster) -> None:
    config = dict(secure_kafka.mtls_client_config())
    del config["ssl.certificate.location"], config["ssl.key.location"]
    errors = _connection_errors(config)
    # The broker's TLS alert (bad_certificate, or certificate_required) arrives
    # after a TLS 1.3 client finished its side of the handshake.
    failures = errors.get(KafkaError._TRANSPORT, "") + errors.get(KafkaError._SSL, "")
    assert "certificate" in failures, errors


def test_java_tool_over_sasl_ssl(secure_kafka: KafkaCluster, secure_topic: Topics) -> None:
    name = secure_topic(partitions=2)
    producer = Producer(secure_kafka.client_config())
    for _ in range(3):
        producer.produce(name, b"v", partition=1)
    assert producer.flush(20) == 0
    properties = secure_kafka.client_properties("alice", "SCRAM-SHA-512")
    _allow(secure_kafka, "alice", name, "unused")
    written = javaproperties.loads(properties.read_text())
    assert written["ssl.truststore.type"] == "PEM"
    assert "ScramLoginModule required" in written["sasl.jaas.config"]
    done = secure_kafka.java_tool("org.apache.kafka.tools.GetOffsetShell",
                                  "--bootstrap-server", secure_kafka.bootstrap_servers,
                                  "--topic", name, "--command-config", str(properties))
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == [f"{name}:0:0", f"{name}:1:3"]


def test_tierproxy_properties(secure_kafka: KafkaCluster) -> None:
    tls = secure_kafka.tls
    assert secure_kafka.tierproxy_properties("alice", "SCRAM-SHA-512") == {
        "bootstrap.servers": secure_kafka.bootstrap_servers,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": SECURE_USERS["alice"],
        "ssl.ca.location": str(tls.ca),
    }
    assert secure_kafka.tierproxy_properties(mtls=True) == {
        "bootstrap.servers": secure_kafka.mtls_bootstrap_servers,
        "security.protocol": "SSL",
        "ssl.ca.location": str(tls.ca),
        "ssl.certificate.location": str(tls.client_cert),
        "ssl.key.location": str(tls.client_key),
    }
    assert secure_kafka.tierproxy_properties()["sasl.username"] == "admin"
    with pytest.raises(ValueError, match="no SASL user"):
        secure_kafka.tierproxy_properties("mallory")


def test_secure_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="users="):
        KafkaCluster(1, secure=True, sasl_plain_users={"a": "b"})
    with pytest.raises(ValueError, match="needs secure=True"):
        KafkaCluster(1, users={"a": "b"})
    with pytest.raises(ValueError, match="brackets"):
        KafkaCluster(1, secure=True, users={"a": "p,w"})
    plain = KafkaCluster(1)
    assert plain.sasl_mechanisms == () and plain.client_security_protocol == "PLAINTEXT"
    with pytest.raises(RuntimeError, match="secure=True"):
        plain.mtls_bootstrap_servers
    sasl = KafkaCluster(1, sasl_plain_users={"a": "b"})
    with pytest.raises(ValueError, match="not enabled"):
        sasl._mechanism("SCRAM-SHA-256")


@pytest.mark.broker
def test_cli_up_secure(tmp_path: Path) -> None:
    state_path, started = up(tmp_path, "--secure", "--user", "carol=carol-secret")
    try:
        assert started.returncode == 0, started.stderr
        kafka = json.loads(started.stdout)["kafka"]
        assert kafka["security_protocol"] == "SASL_SSL"
        assert kafka["users"] == {"admin": "admin-secret", "carol": "carol-secret"}
        sasl = kafka["tierproxy_properties"]["sasl"]
        assert sasl["bootstrap.servers"] == kafka["bootstrap_servers"]
        assert Path(sasl["ssl.ca.location"]).read_text().startswith("-----BEGIN CERTIFICATE-----")
        mtls_file = Path(kafka["tierproxy_properties_files"]["mtls"])
        assert javaproperties.loads(mtls_file.read_text()) == kafka["tierproxy_properties"]["mtls"]
        # tierproxy takes librdkafka's key names, so librdkafka can check them.
        carol = {**sasl, "sasl.username": "carol", "sasl.password": "carol-secret"}
        for config in (sasl, carol, kafka["tierproxy_properties"]["mtls"]):
            assert Producer(config).list_topics(timeout=10).brokers
    finally:
        shown = run_testbed(state_path, "status")
        stopped = run_testbed(state_path, "down")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert json.loads(shown.stdout)["kafka"]["brokers"][0]["answers_api_versions"] is True
    assert stopped.returncode == 0, stopped.stderr
    assert not any(is_alive(b["pid"]) for b in kafka["brokers"])
    assert pids_running(str(tmp_path)) == []
