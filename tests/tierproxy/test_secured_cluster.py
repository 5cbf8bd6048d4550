"""tierproxy end to end against a cluster that accepts nothing plaintext.

The testbed's secured broker has a SASL_SSL client listener (SCRAM-SHA-256,
SCRAM-SHA-512, PLAIN; a CA of its own) and a mutual-TLS listener. Every command runs as
a user would run it, from one properties file: `tierproxy tier` (Spark local mode, the
`__remote_log_metadata` topic backend), `tierproxy status`, `tierproxy serve` (TLS to
its clients, who log in through it with SCRAM), and `tierproxy loadtest`. Wrong
credentials and untrusted certificates end in one line that names the key to fix.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tierproxy.client.cluster import Cluster
from tierproxy.client.connection import AuthenticationError
from tierproxy.config import parse
from testbed.kafka import KafkaCluster
from testbed.ports import free_ports
from tests.helpers.commands import SPARK_ENV, TIERPROXY, write_properties

RECORDS_PER_PARTITION = 2_000
PARTITIONS = 2


def tiering_properties(kafka: KafkaCluster, work: Path, topic: str, **security: str) -> dict[str, str]:
    """One file for the pipeline, status and the proxy, with the topic metadata backend."""
    proxy_port, node_base = free_ports(2)
    return {
        **(security or kafka.tierproxy_properties(mechanism="SCRAM-SHA-512")),
        "remote.log.storage.backend": "local",
        "remote.log.storage.local.dir": str(work / "remote"),
        "remote.log.metadata.backend": "topic",
        "remote.log.metadata.dir": str(work / "metadata"),
        "remote.log.metadata.topic.num.partitions": "3",
        "spark.master": "local[2]",
        f"topic.{topic}.remote.storage.enable": "true",
        f"topic.{topic}.segment.bytes": str(64 * 1024),
        f"topic.{topic}.segment.ms": "1000",
        f"topic.{topic}.local.retention.ms": "0",
        f"topic.{topic}.retention.ms": "-1",
        "proxy.listener.host": "127.0.0.1",
        "proxy.bootstrap.port": str(proxy_port),
        "proxy.broker.port.base": str(node_base),
        "proxy.ssl.certificate.location": str(kafka.tls.broker_cert),
        "proxy.ssl.key.location": str(kafka.tls.broker_key),
        "metrics.port": "0",
    }


def tierproxy(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(TIERPROXY), *args], env=SPARK_ENV, capture_output=True, text=True, timeout=timeout)


def produce(kafka: KafkaCluster, topic: str) -> tuple[list[tuple[int, bytes]], int]:
    """(partition, key) of every record sent, and the newest record's timestamp."""
    producer = Producer({**kafka.client_config(mechanism="SCRAM-SHA-512"), "linger.ms": 20})
    sent, errors, timestamps = [], [], [0]

    def delivered(error, message) -> None:
        if error:
            errors.append(error)
        else:
            timestamps.append(message.timestamp()[1])

    for i in range(RECORDS_PER_PARTITION * PARTITIONS):
        key = f"k{i:06d}".encode()
        producer.produce(topic, key=key, value=key * 20, partition=i % PARTITIONS, on_delivery=delivered)
        sent.append((i % PARTITIONS, key))
    assert producer.flush(30) == 0 and not errors, errors[:3]
    return sent, max(timestamps)


@contextmanager
def serving(properties: Path, port: int, log: Path) -> Iterator[subprocess.Popen]:
    with open(log, "w") as out:
        proxy = subprocess.Popen([str(TIERPROXY), "serve", "--config", str(properties)], env=SPARK_ENV,
                                 stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proxy.poll() is None, log.read_text()[-3000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
        yield proxy
    finally:
        proxy.terminate()
        proxy.wait(30)


def consume_all(config: dict[str, str], topic: str, expected: int) -> list[tuple[int, int, bytes]]:
    consumer = Consumer({**config, "group.id": "secured-e2e", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    records = []
    deadline = time.monotonic() + 90
    try:
        while len(records) < expected and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=1):
                assert message.error() is None, message.error()
                records.append((message.partition(), message.offset(), message.key()))
    finally:
        consumer.close()
    return records


def one_line_error(done: subprocess.CompletedProcess, *names: str) -> str:
    """The command failed with a single stderr line of its own naming every key."""
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("tierproxy")]
    assert len(lines) == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


@pytest.mark.timeout(600)
def test_tier_status_serve_and_loadtest_with_nothing_plaintext(secure_kafka, secure_topic, tmp_path):
    name = secure_topic(partitions=PARTITIONS, config={"retention.ms": "-1"})
    sent, newest_ms = produce(secure_kafka, name)
    # The newest remote segment is cut once it is segment.ms (1 s) old.
    time.sleep(max(0.0, newest_ms / 1000 + 1.5 - time.time()))
    values = tiering_properties(secure_kafka, tmp_path, name)
    properties = write_properties(tmp_path / "tierproxy.properties", values)

    tier = tierproxy("tier", "--config", str(properties))
    assert tier.returncode == 0, tier.stderr[-4000:]
    assert f"{PARTITIONS} partitions," in tier.stdout  # the summary line
    assert secure_kafka.sasl_plain_users["admin"] not in tier.stdout + tier.stderr

    status = tierproxy("status", "--config", str(properties), "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    partitions = json.loads(status.stdout)["partitions"]
    assert len(partitions) == PARTITIONS
    for p in partitions:
        assert p["rx"] == 0 and p["lx"] > 0, p  # remote from offset 0, the broker trimmed

    consumer = {**secure_kafka.client_config(mechanism="SCRAM-SHA-256"),
                "bootstrap.servers": f"127.0.0.1:{values['proxy.bootstrap.port']}"}
    with serving(properties, int(values["proxy.bootstrap.port"]), tmp_path / "proxy.log"):
        records = consume_all(consumer, name, len(sent))
        by_partition = {p: [r for r in records if r[0] == p] for p in range(PARTITIONS)}
        for p in range(PARTITIONS):
            assert [offset for _, offset, _ in by_partition[p]] == list(range(RECORDS_PER_PARTITION))
            assert [key for _, _, key in by_partition[p]] == [k for q, k in sent if q == p]

        # The loadtest's consumers log in through the proxy the same way, from a file.
        client = write_properties(tmp_path / "client.properties", consumer)
        load = tierproxy("loadtest", "--bootstrap", consumer["bootstrap.servers"], "--topic", name,
                         "--config", str(client), "--json", timeout=180)
        assert load.returncode == 0, load.stderr[-3000:]
        summary = json.loads(load.stdout)
        assert summary["records"] == len(sent) and not summary["errors"], summary
    log = (tmp_path / "proxy.log").read_text()
    assert "Traceback" not in log and secure_kafka.sasl_plain_users["admin"] not in log


def test_wrong_password_and_untrusted_ca_are_one_line_errors(secure_kafka, tmp_path):
    good = secure_kafka.tierproxy_properties(mechanism="SCRAM-SHA-512")
    wrong = write_properties(tmp_path / "wrong.properties", {**good, "sasl.password": "not-the-password"})
    line = one_line_error(tierproxy("status", "--config", str(wrong)), "sasl.username", "sasl.password")
    assert "not-the-password" not in line
    one_line_error(tierproxy("tier", "--config", str(wrong)), "sasl.username", "sasl.password")
    one_line_error(tierproxy("serve", "--config", str(wrong)), "sasl.username", "sasl.password")

    untrusted = write_properties(tmp_path / "untrusted.properties",
                                 {**good, "ssl.ca.location": str(secure_kafka.tls.other_ca)})
    one_line_error(tierproxy("status", "--config", str(untrusted)), "not trusted", "ssl.ca.location")

    plaintext = write_properties(tmp_path / "plaintext.properties",
                                 {**good, "security.protocol": "SASL_PLAINTEXT"})
    one_line_error(tierproxy("status", "--config", str(plaintext)), "security.protocol")

    missing = write_properties(tmp_path / "missing.properties", {**good, "ssl.ca.location": str(tmp_path / "no.pem")})
    one_line_error(tierproxy("config", "check", "--config", str(missing)), "ssl.ca.location", "cannot read")


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_every_mechanism_and_the_jaas_spelling(secure_kafka, mechanism):
    values = secure_kafka.tierproxy_properties(mechanism=mechanism)
    module = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule"}.get(
        mechanism, "org.apache.kafka.common.security.scram.ScramLoginModule")
    jaas = {**{k: v for k, v in values.items() if k not in ("sasl.username", "sasl.password")},
            "sasl.jaas.config": f'{module} required username="{values["sasl.username"]}" '
                                f'password="{values["sasl.password"]}";'}
    for spelling in (values, jaas):
        async with Cluster.from_config(parse(spelling)) as cluster:
            await cluster.topics([])  # logged in: Metadata answered
    bad = parse({**jaas, "sasl.jaas.config": jaas["sasl.jaas.config"].replace(values["sasl.password"], "x")})
    with pytest.raises(AuthenticationError, match="sasl.username"):
        async with Cluster.from_config(bad) as cluster:
            await cluster.topics([])


async def test_mutual_tls_and_a_missing_client_certificate(secure_kafka, tmp_path):
    mtls = secure_kafka.tierproxy_properties(mtls=True)
    async with Cluster.from_config(parse(mtls)) as cluster:
        await cluster.topics([])
    status = tierproxy("status", "--config", str(write_properties(
        tmp_path / "mtls.properties", {**mtls, "remote.log.metadata.dir": str(tmp_path / "metadata")})))
    assert status.returncode == 0, status.stderr[-3000:]
    no_certificate = {k: v for k, v in mtls.items() if k not in ("ssl.certificate.location", "ssl.key.location")}
    with pytest.raises(AuthenticationError, match="ssl.keystore.location or ssl.certificate.location"):
        async with Cluster.from_config(parse(no_certificate)) as cluster:
            await cluster.topics([])
