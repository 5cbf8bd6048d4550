"""The real Kafka cluster from testbed/: readiness, clients, topics, tools, SASL."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import KafkaError, Producer

from testbed import probe
from testbed.fixtures import Topics
from testbed.kafka import KafkaCluster, KafkaStartError
from testbed.ports import free_port
from testbed.processes import is_alive, pids_running

API_VERSIONS, FETCH, PRODUCE = 18, 1, 0


def test_broker_answers_api_versions(kafka_cluster: KafkaCluster) -> None:
    [(node_id, host, port)] = kafka_cluster.brokers
    versions = probe.api_versions(host, port)
    assert node_id == 0
    assert versions[API_VERSIONS][1] >= 3
    assert versions[FETCH][1] >= 12 and versions[PRODUCE][1] >= 9
    assert kafka_cluster.bootstrap_servers == f"{host}:{port}"
    assert kafka_cluster.log_dirs[0].is_dir()


def test_probe_fails_where_no_broker_listens() -> None:
    assert not probe.answers("127.0.0.1", free_port(), timeout=0.5)


async def test_produce_consume_round_trip(bootstrap_servers: str, topic: Topics) -> None:
    name = topic(partitions=2)
    sent = {f"key-{i}".encode(): f"value-{i}".encode() for i in range(20)}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all")
    await producer.start()
    try:
        for key, value in sent.items():
            await producer.send_and_wait(name, value, key=key)
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(name, bootstrap_servers=bootstrap_servers,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    received: dict[bytes, bytes] = {}
    try:
        async with asyncio.timeout(30):
            while len(received) < len(sent):
                batch = await consumer.getmany(timeout_ms=1000)
                for records in batch.values():
                    received.update((r.key, r.value) for r in records)
    finally:
        await consumer.stop()
    assert received == sent


def test_topic_factory_creates_and_deletes(kafka_cluster: KafkaCluster) -> None:
    topics = Topics(kafka_cluster, "factory[case 1]")
    first = topics(partitions=3, config={"retention.ms": 86_400_000})
    second = topics()
    assert first.startswith("factory-case-1-") and first != second
    listed = kafka_cluster.admin().list_topics(timeout=10).topics
    assert len(listed[first].partitions) == 3
    assert all(p.leader == 0 for p in listed[first].partitions.values())
    assert len(listed[second].partitions) == 1

    kafka_cluster.delete_topic(second)  # deleting one twice must not fail teardown
    topics.delete_all()
    listed = kafka_cluster.admin().list_topics(timeout=10).topics
    assert first not in listed and second not in listed
    assert topics.created == []


def test_small_segments_through_internal_segment_bytes(kafka_cluster: KafkaCluster,
                                                       topic: Topics) -> None:
    name = topic(config={"internal.segment.bytes": 16_384})
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    for _ in range(40):
        producer.produce(name, b"x" * 1000)
        producer.flush(10)  # one batch per record, so segments roll
    segments = sorted((kafka_cluster.log_dirs[0] / f"{name}-0").glob("*.log"))
    assert len(segments) >= 2


def test_java_tool_get_offset_shell(kafka_cluster: KafkaCluster, topic: Topics) -> None:
    name = topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    for i in range(5):
        producer.produce(name, b"v", partition=1)
    producer.flush(10)
    done = kafka_cluster.java_tool("org.apache.kafka.tools.GetOffsetShell",
                                   "--bootstrap-server", kafka_cluster.bootstrap_servers,
                                   "--topic", name)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == [f"{name}:0:0", f"{name}:1:5"]


def test_broker_log_uses_log4j2_without_slf4j_warnings(kafka_cluster: KafkaCluster) -> None:
    node_home = kafka_cluster.workdir / "node-0"
    server_log = (node_home / "server.log").read_text()
    assert "Kafka Server started" in server_log or "Transition from STARTING to STARTED" in server_log
    assert "SLF4J" not in (node_home / "stdout.log").read_text()


@pytest.mark.broker
def test_start_failure_reports_the_cause(tmp_path) -> None:
    cluster = KafkaCluster(1, broker_config={"log.segment.bytes": 1000}, workdir=tmp_path)
    with pytest.raises(KafkaStartError, match="Value must be at least 1048576"):
        cluster.start()
    with pytest.raises(RuntimeError, match="not started"):
        cluster.brokers
    assert pids_running(str(tmp_path)) == []


@pytest.mark.broker
def test_three_brokers_form_one_cluster(kafka_cluster_3: KafkaCluster) -> None:
    for _, host, port in kafka_cluster_3.brokers:
        assert sorted(probe.metadata_brokers(host, port)) == sorted(kafka_cluster_3.brokers)
    metadata = kafka_cluster_3.admin().list_topics(timeout=10)
    assert {(b.id, b.host, b.port) for b in metadata.brokers.values()} == set(
        kafka_cluster_3.brokers)
    assert sorted(metadata.brokers) == [0, 1, 2]
    topics = Topics(kafka_cluster_3, "replicated")
    name = topics(partitions=3, replication=3)
    try:
        partitions = kafka_cluster_3.admin().list_topics(timeout=10).topics[name].partitions
        assert all(sorted(p.replicas) == [0, 1, 2] for p in partitions.values())
        assert {p.leader for p in partitions.values()} <= {0, 1, 2}
    finally:
        topics.delete_all()


def test_sasl_plain_with_authorizer(sasl_kafka: KafkaCluster) -> None:
    cluster = sasl_kafka
    assert probe.answers(*cluster.brokers[0][1:])  # ApiVersions needs no login
    topics = Topics(cluster, "guarded")
    try:
        guarded = topics()
        outcomes: dict[str, KafkaError | None] = {}
        for user in ("admin", "alice"):
            producer = Producer({**cluster.client_config(user), "message.timeout.ms": 10_000})
            producer.produce(guarded, b"v", on_delivery=lambda err, _msg, u=user:
                             outcomes.__setitem__(u, err))
            producer.flush(15)
        assert outcomes["admin"] is None
        assert outcomes["alice"] is not None
        assert outcomes["alice"].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        listed = cluster.java_tool("org.apache.kafka.tools.GetOffsetShell",
                                   "--bootstrap-server", cluster.bootstrap_servers,
                                   "--topic", guarded,
                                   "--command-config", str(cluster.client_properties()))
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.split() == [f"{guarded}:0:1"]
        # One broker, stopped with the cluster (the fixture checks that at the end of the run).
        assert len(pids_running(str(cluster.workdir))) == 1
    finally:
        topics.delete_all()


_CHILD = """
import os, signal, sys
from testbed.kafka import KafkaCluster
cluster = KafkaCluster(1, workdir=__import__("pathlib").Path(sys.argv[2])).start()
print(list(cluster.pids.values())[0], flush=True)
if sys.argv[1] == "crash":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(3)  # no stop(): atexit has to do it
"""


@pytest.mark.broker
def test_a_dying_test_process_takes_its_brokers_along(tmp_path) -> None:
    children = {
        how: subprocess.Popen([sys.executable, "-c", _CHILD, how, str(tmp_path / how)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for how in ("crash", "exit")
    }
    outcomes = {how: child.communicate(timeout=120) for how, child in children.items()}
    assert children["crash"].returncode == -signal.SIGKILL, outcomes["crash"][1]
    assert children["exit"].returncode == 3, outcomes["exit"][1]
    deadline = time.monotonic() + 10
    broker_pids = [int(out.split()[0]) for out, _ in outcomes.values()]
    while any(is_alive(pid) for pid in broker_pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(is_alive(pid) for pid in broker_pids)
    assert pids_running(str(tmp_path)) == []


def test_metadata_probe_lists_the_broker(kafka_cluster: KafkaCluster) -> None:
    [(node_id, host, port)] = kafka_cluster.brokers
    assert probe.metadata_brokers(host, port) == [(node_id, host, port)]
