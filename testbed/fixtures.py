"""pytest plugin: the real Kafka cluster and S3 server for tests.

Enable with ``pytest_plugins = ["testbed.fixtures"]`` in the top-level conftest.

- ``kafka_cluster``: one KRaft broker for the whole test run, started on first
  use. ``log.segment.bytes`` is ``$TIERPROXY_TEST_LOG_SEGMENT_BYTES`` or
  1048576, the smallest value Kafka 4 accepts. Smaller segments are a topic
  setting: ``topic(config={"internal.segment.bytes": 16384})`` (Kafka's
  test-only topic config, without the 1 MiB floor of ``segment.bytes``).
- ``kafka_cluster_3``: three nodes, started only if a test asks for it.
- ``secure_kafka``: one node with ``secure=True`` (SASL_SSL with SCRAM-SHA-256,
  SCRAM-SHA-512 and PLAIN; an MTLS listener), started only if a test asks for
  it. Users ``SECURE_USERS`` (alice, bob) have no ACLs; tests add what they need.
- ``sasl_kafka``: one node with a SASL_PLAINTEXT (PLAIN) client listener and Kafka's
  StandardAuthorizer, started only if a test asks for it. Users ``SASL_USERS`` (alice,
  bob, carol, dave) have no ACLs; tests add what they need, on topics of their own.
- ``bootstrap_servers``: ``kafka_cluster.bootstrap_servers``.
- ``topic``: a factory, ``topic(partitions=1, config=None, replication=1) -> name``;
  each topic is uniquely named and deleted after the test.
- ``secure_topic``: the same factory on ``secure_kafka`` (created as admin).
- ``s3_server``: moto's S3 server with the bucket created, for the whole run.
  A test that stops or restarts it must leave it running, bucket included.
- ``iceberg_rest_catalog``: Apache Iceberg's REST catalog server (testbed.iceberg_rest) with
  its warehouse in a local folder, started on first use, for the whole run;
  ``iceberg_rest_catalog_s3``: another one with its warehouse in ``s3_server``'s bucket.
  Tests create namespaces and tables of their own names.

Tests using the broker fixtures are marked ``broker``, those using
``s3_server`` are marked ``s3`` (``pytest -m broker``).
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Any, Iterator, Mapping

import pytest

from testbed.iceberg_rest import IcebergRestCatalog
from testbed.kafka import KafkaCluster
from testbed.processes import pids_running
from testbed.s3 import S3Server

SEGMENT_BYTES_ENV = "TIERPROXY_TEST_LOG_SEGMENT_BYTES"
DEFAULT_SEGMENT_BYTES = 1024 * 1024

SECURE_USERS = {"alice": "alice-secret", "bob": "bob-secret"}
SASL_USERS = {"alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret", "dave": "dave-secret"}

_BROKER_FIXTURES = {"kafka_cluster", "kafka_cluster_3", "bootstrap_servers", "topic",
                    "secure_kafka", "secure_topic", "sasl_kafka"}
_S3_FIXTURES = {"s3_server", "iceberg_rest_catalog_s3"}


def _test_broker_config() -> dict[str, str]:
    return {"log.segment.bytes": os.environ.get(SEGMENT_BYTES_ENV, str(DEFAULT_SEGMENT_BYTES))}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & _BROKER_FIXTURES:
            item.add_marker(pytest.mark.broker)
        if fixtures & _S3_FIXTURES:
            item.add_marker(pytest.mark.s3)


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaCluster]:
    with KafkaCluster(1, broker_config=_test_broker_config()) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def kafka_cluster_3() -> Iterator[KafkaCluster]:
    with KafkaCluster(3, broker_config=_test_broker_config()) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def secure_kafka() -> Iterator[KafkaCluster]:
    with KafkaCluster(1, broker_config=_test_broker_config(), secure=True,
                      users=SECURE_USERS) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def sasl_kafka() -> Iterator[KafkaCluster]:
    with KafkaCluster(1, broker_config=_test_broker_config(), sasl_plain_users=SASL_USERS) as cluster:
        workdir = str(cluster.workdir)
        yield cluster
    # Stopping it stopped its broker (tests/testbed/test_testbed_kafka.py checks the one it runs).
    assert pids_running(workdir) == [], f"brokers of {workdir} outlived the cluster"


@pytest.fixture(scope="session")
def bootstrap_servers(kafka_cluster: KafkaCluster) -> str:
    return kafka_cluster.bootstrap_servers


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture(scope="session")
def iceberg_rest_catalog() -> Iterator[IcebergRestCatalog]:
    with IcebergRestCatalog() as catalog:
        yield catalog


@pytest.fixture(scope="session")
def iceberg_rest_catalog_s3(s3_server: S3Server) -> Iterator[IcebergRestCatalog]:
    with IcebergRestCatalog(s3=s3_server, prefix="iceberg-rest") as catalog:
        yield catalog


class Topics:
    """Creates uniquely named topics on ``cluster`` and deletes them all at the end."""

    def __init__(self, cluster: KafkaCluster, stem: str = "t") -> None:
        self.cluster = cluster
        # Topic names allow [a-zA-Z0-9._-]; the test name makes broker logs readable.
        self.stem = re.sub(r"[^a-zA-Z0-9._-]+", "-", stem)[:80].strip("-.") or "t"
        self.created: list[str] = []

    def __call__(self, partitions: int = 1, config: Mapping[str, Any] | None = None,
                 replication: int = 1) -> str:
        name = f"{self.stem}-{uuid.uuid4().hex[:8]}"
        self.cluster.create_topic(name, partitions=partitions, replication=replication,
                                  config=config)
        self.created.append(name)
        return name

    def delete_all(self) -> None:
        from confluent_kafka import KafkaError, KafkaException

        while self.created:
            name = self.created.pop()
            try:
                self.cluster.delete_topic(name)
            except KafkaException as exc:
                # The test may have deleted the topic itself.
                if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise


@pytest.fixture
def topic(kafka_cluster: KafkaCluster, request: pytest.FixtureRequest) -> Iterator[Topics]:
    topics = Topics(kafka_cluster, request.node.name)
    yield topics
    topics.delete_all()


@pytest.fixture
def secure_topic(secure_kafka: KafkaCluster, request: pytest.FixtureRequest) -> Iterator[Topics]:
    topics = Topics(secure_kafka, request.node.name)
    yield topics
    topics.delete_all()
