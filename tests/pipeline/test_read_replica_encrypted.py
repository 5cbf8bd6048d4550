"""A read replica of encrypted segments in an SSE bucket.

The origin tiers two topics into one moto bucket with S3 server-side encryption (SSE-KMS)
on every object: `sealed` under envelope encryption with key k1, `plain` before
encryption was turned on. A proxy in front of the replica cluster (SASL, Kafka's
StandardAuthorizer) reads the remote log metadata the pipeline publishes there.

With k1 configured on the replica alice replays both topics exactly from offset 0. Without
k1, or with other material under the id k1, each partition of `sealed` is refused as the
origin's proxy refuses it (TIERED_STORAGE_NOT_AVAILABLE: UNKNOWN_SERVER_ERROR on the wire,
counted by cause, no bytes) and `plain` is served in full; with encryption required there,
`plain` is refused and `sealed` served. The replica's file has no SSE setting: reading
needs none. `tierproxy status` on it names the key its segments need; `replica create`
and the proxy reach a SASL_SSL-only cluster with tierproxy's security keys.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AclOperation, ResourceType
from kio.schema.list_offsets.v9 import request as list_offsets9
from kio.static.primitive import i8, i32, i32Timedelta, i64

from testbed.fixtures import _test_broker_config
from testbed.kafka import KafkaCluster
from tierproxy.cli import main
from tierproxy.protocol.apis import ErrorCode, OffsetSpec
from tierproxy.remote_log.failures import Cause
from tests.helpers.acl import authenticated, fetch_at, grant
from tests.helpers.commands import write_properties
from tests.helpers.consume import consume_confluent_assigned, record_keys
from tests.helpers.proxy import ProxyThread, proxy_config, running
from tests.helpers.read_replica import Origin, replay, replica_settings
from tests.helpers.tiered import encryption_keys, plaintext_bootstrap, write_key

pytestmark = pytest.mark.timeout(600)

PARTITIONS = 2
PER_PARTITION = 300
# Its own folder of the session's bucket: other modules tier there too (test_read_replica's
# prefixes are its topics, "replicated-...").
KEY_PREFIX = f"replicated-sse-{uuid.uuid4().hex[:8]}"
SSE = {"remote.log.storage.s3.sse": "aws:kms", "remote.log.storage.s3.sse.kms.key.id": "alias/tierproxy"}


class Origins:
    """The origin cluster's two tiered topics and the key k1."""

    def __init__(self, sealed: Origin, plain: Origin, k1: Path) -> None:
        self.sealed = sealed
        self.plain = plain
        self.k1 = k1


@pytest.fixture(scope="module")
def origins(spark, s3_server, tmp_path_factory) -> Iterator[Origins]:
    root = tmp_path_factory.mktemp("origin")
    k1 = write_key(root / "keys" / "k1.key")
    store = {**s3_server.storage_properties(KEY_PREFIX), **SSE, "remote.log.metadata.backend": "file",
             "remote.log.metadata.dir": str(root / "metadata")}
    encrypted = {"remote.log.storage.encryption.keys": encryption_keys({"k1": k1}),
                 "remote.log.storage.encryption.active.key": "k1"}
    suffix = uuid.uuid4().hex[:8]
    with KafkaCluster(1, broker_config=_test_broker_config()) as cluster:
        plain = Origin(cluster, f"plain-{suffix}", PARTITIONS, store, root)
        # The second pass keeps `plain` tiered (its segments stay as they are) and copies `sealed`.
        sealed = Origin(cluster, f"sealed-{suffix}", PARTITIONS, {
            **store, **encrypted, f"topic.{plain.topic}.remote.storage.enable": "true",
            f"topic.{plain.topic}.remote.log.copy.disable": "true"}, root)
        for origin in (plain, sealed):  # plain tiered first, before encryption was turned on
            cluster.create_topic(origin.topic, partitions=PARTITIONS)
            origin.produce(PER_PARTITION)
            origin.tier(spark)
        yield Origins(sealed, plain, k1)


@pytest.fixture(scope="module")
def replica_base(origins, tmp_path_factory) -> dict[str, str]:
    """The replica's settings without any encryption key: the store without its SSE keys
    (reading an SSE object needs none), the metadata the pipeline publishes into the bucket,
    both topics replicas."""
    metadata = {"remote.log.metadata.backend": "remote",
                "remote.log.metadata.dir": str(tmp_path_factory.mktemp("replica-metadata")),
                "remote.log.replica.refresh.interval.ms": "1000"}
    settings = replica_settings(origins.sealed, metadata, origins.sealed.topic, origins.plain.topic)
    return {key: value for key, value in settings.items()
            if not key.startswith(("remote.log.storage.encryption.", "remote.log.storage.s3.sse"))}


@pytest.fixture(scope="module")
def replica_cluster(origins, replica_base, sasl_kafka, tmp_path_factory) -> Iterator[KafkaCluster]:
    """Both topics created on the replica cluster (`tierproxy replica create`, which needs no
    key), alice may read them."""
    path = write_properties(tmp_path_factory.mktemp("replica") / "replica.properties",
                            {**replica_base, "bootstrap.servers": plaintext_bootstrap(sasl_kafka)})
    assert main(["replica", "create", "--config", str(path)]) == 0
    topics = (origins.sealed.topic, origins.plain.topic)
    for topic in topics:
        grant(sasl_kafka, "alice", ResourceType.TOPIC, topic, AclOperation.READ, AclOperation.DESCRIBE)
    grant(sasl_kafka, "alice", ResourceType.GROUP, "*", AclOperation.READ, AclOperation.DESCRIBE)
    try:
        yield sasl_kafka
    finally:
        for topic in topics:
            sasl_kafka.delete_topic(topic)


def _replica(cluster: KafkaCluster, base: dict[str, str], **keys: object):
    return running(proxy_config(cluster.bootstrap_servers, len(cluster.brokers), **base,
                                **{f"remote.log.storage.encryption.{k.replace('_', '.')}": str(v)
                                   for k, v in keys.items()}))


async def _replays_exactly(proxy: ProxyThread, origin: Origin) -> None:
    assert await replay(proxy, origin.topic, PARTITIONS, len(origin.records)) == record_keys(origin.records)


_PATIENT = datetime.timedelta(seconds=30)
_NOT_YET = (ErrorCode.replica_not_available, ErrorCode.leader_not_available,
            ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition)


async def _refused(proxy: ProxyThread, origin: Origin, cause: Cause) -> None:
    """Every partition of the topic: alice's Fetch of offset 0 gets UNKNOWN_SERVER_ERROR and
    no bytes, counted under `cause`, as the origin's proxy answers."""
    conn = await authenticated(proxy.bootstrap_servers, "alice")
    try:
        for partition in range(PARTITIONS):
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                response = await conn.request(fetch_at(origin.topic, 0, partition))
                (answer,) = response.responses[0].partitions
                # Asked again while the replica's metadata or the broker's ACLs still load, and
                # while the remote read runs past remote.fetch.max.wait.ms (an empty answer, as
                # Kafka gives for a remote read that did not finish in time).
                waiting = answer.error_code in _NOT_YET or (answer.error_code == ErrorCode.none and not answer.records)
                if not waiting or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert (answer.partition_index, answer.error_code, bytes(answer.records or b"")) == \
                (partition, ErrorCode.unknown_server_error, b"")
        # Kafka answers an error at once: a Fetch that would wait 30 s for a byte is not held.
        # On a loaded machine the remote read may again run past remote.fetch.max.wait.ms: that
        # empty answer is not held either, and the Fetch is asked again.
        patient = dataclasses.replace(fetch_at(origin.topic, 0), max_wait=i32Timedelta.parse(_PATIENT))
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            started = asyncio.get_running_loop().time()
            response = await conn.request(patient)
            held = asyncio.get_running_loop().time() - started
            assert held < _PATIENT.total_seconds() / 2, held
            (answer,) = response.responses[0].partitions
            if answer.error_code != ErrorCode.none or answer.records or asyncio.get_running_loop().time() > deadline:
                break
        assert (answer.error_code, bytes(answer.records or b"")) == (ErrorCode.unknown_server_error, b"")
    finally:
        await conn.close()
    labels = {"topic": origin.topic, "cause": cause.value}
    assert proxy.metrics.value("tierproxy_tiered_storage_not_available_total", labels) >= PARTITIONS


async def _list_offsets(proxy: ProxyThread, topic: str, spec: int) -> tuple[int, int]:
    """Error code and offset of alice's ListOffsets of partition 0 at `spec`."""
    conn = await authenticated(proxy.bootstrap_servers, "alice")
    try:
        partition = list_offsets9.ListOffsetsPartition(partition_index=i32(0), timestamp=i64(spec))
        response = await conn.request(list_offsets9.ListOffsetsRequest(
            replica_id=i32(-1), isolation_level=i8(0),
            topics=(list_offsets9.ListOffsetsTopic(name=topic, partitions=(partition,)),)))
    finally:
        await conn.close()
    (answer,) = response.topics[0].partitions
    return answer.error_code, answer.offset


async def test_the_bucket_holds_sealed_segments_and_every_object_is_sse(origins, s3_server):
    """What the replica reads: `sealed`'s segments ciphertext, `plain`'s plaintext, and SSE-KMS
    on every object, the remote log metadata published for replicas too."""
    client = s3_server.client()
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=s3_server.bucket, Prefix=f"{KEY_PREFIX}/") for o in page.get("Contents", ())]
    for origin, sealed in ((origins.sealed, True), (origins.plain, False)):
        logs = [key for key in keys if origin.topic in key and key.endswith(".log")]
        assert len(logs) >= PARTITIONS, keys
        for key in logs:
            stored = client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read()
            assert any(r.value in stored for r in origin.records) != sealed, key
    metadata = [key for key in keys if origins.sealed.topic not in key and origins.plain.topic not in key]
    assert metadata, keys
    for key in keys:
        head = client.head_object(Bucket=s3_server.bucket, Key=key)
        assert head["ServerSideEncryption"] == "aws:kms" and head["SSEKMSKeyId"].endswith("alias/tierproxy"), key


async def test_with_the_key_on_the_replica_both_topics_replay_exactly(origins, replica_cluster, replica_base):
    with _replica(replica_cluster, replica_base, keys=encryption_keys({"k1": origins.k1})) as proxy:
        await _replays_exactly(proxy, origins.sealed)
        await _replays_exactly(proxy, origins.plain)


async def test_without_the_key_the_sealed_topic_is_refused_and_the_plain_one_served(
        origins, replica_cluster, replica_base):
    with _replica(replica_cluster, replica_base) as proxy:
        await _refused(proxy, origins.sealed, Cause.KEY_NOT_FOUND)
        await _replays_exactly(proxy, origins.plain)
        # Offsets are the metadata's, no key needed; a timestamp needs a segment's index.
        sealed = [r for r in origins.sealed.records if r.partition == 0]
        assert await _list_offsets(proxy, origins.sealed.topic, OffsetSpec.LATEST) == (ErrorCode.none, len(sealed))
        assert await _list_offsets(proxy, origins.sealed.topic, sealed[10].timestamp_ms) == \
            (ErrorCode.unknown_server_error, -1)


async def test_with_a_wrong_key_the_sealed_topic_is_refused_and_the_plain_one_served(
        origins, replica_cluster, replica_base, tmp_path):
    impostor = write_key(tmp_path / "other.key")
    with _replica(replica_cluster, replica_base, keys=encryption_keys({"k1": impostor})) as proxy:
        await _refused(proxy, origins.sealed, Cause.WRONG_KEY)
        await _replays_exactly(proxy, origins.plain)


async def test_with_encryption_required_the_plain_topic_is_refused_and_the_sealed_one_served(
        origins, replica_cluster, replica_base):
    with _replica(replica_cluster, replica_base, keys=encryption_keys({"k1": origins.k1}), active_key="k1",
                  required="true") as proxy:
        await _refused(proxy, origins.plain, Cause.UNENCRYPTED)
        await _replays_exactly(proxy, origins.sealed)


async def test_on_a_cluster_with_nothing_plaintext_the_replica_uses_its_security_keys(
        origins, replica_base, secure_kafka, tmp_path):
    """The replica cluster takes only SASL_SSL: `replica create` and the proxy reach it with
    tierproxy's security keys (SCRAM-SHA-512, its CA), clients log in through the proxy
    over TLS with SCRAM-SHA-256, and librdkafka reads the sealed topic with k1."""
    settings = {**replica_base, **secure_kafka.tierproxy_properties(mechanism="SCRAM-SHA-512"),
                "remote.log.storage.encryption.keys": encryption_keys({"k1": origins.k1})}
    path = write_properties(tmp_path / "replica.properties", settings)
    assert await asyncio.to_thread(main, ["replica", "create", "--config", str(path)]) == 0
    try:
        config = proxy_config(secure_kafka.bootstrap_servers, len(secure_kafka.brokers), **settings,
                              **{"proxy.ssl.certificate.location": str(secure_kafka.tls.broker_cert),
                                 "proxy.ssl.key.location": str(secure_kafka.tls.broker_key)})
        with running(config) as proxy:
            client = {**secure_kafka.client_config(mechanism="SCRAM-SHA-256"),
                      "bootstrap.servers": proxy.bootstrap_servers}
            consumed = await asyncio.to_thread(consume_confluent_assigned, client, origins.sealed.topic,
                                               range(PARTITIONS), len(origins.sealed.records))
        assert sorted(consumed) == record_keys(origins.sealed.records)
    finally:
        for topic in (origins.sealed.topic, origins.plain.topic):
            secure_kafka.delete_topic(topic)


async def test_status_of_the_replica_names_the_key_its_segments_need(origins, replica_cluster, replica_base,
                                                                   tmp_path, capsys):
    """`tierproxy status` on the replica's configuration: each replica partition's remote range
    (the origin's), the replica broker's own empty log, and the key ids its segments use;
    without k1 every sealed segment is a problem naming it, with k1 there is none."""
    settings = {**replica_base, "bootstrap.servers": plaintext_bootstrap(replica_cluster)}
    without = write_properties(tmp_path / "without.properties", settings)
    assert await asyncio.to_thread(main, ["status", "--config", str(without), "--json"]) == 1
    out, err = capsys.readouterr()
    rows = {(p["topic"], p["partition"]): p for p in json.loads(out)["partitions"]}
    for origin in (origins.sealed, origins.plain):
        for partition, end in origin.ends().items():
            row = rows.pop((origin.topic, partition))
            # The broker columns are the replica cluster's own log of the topic: empty.
            assert (row["rx"], row["ry"], row["lx"], row["ly"], row["lz"]) == (0, end - 1, 0, 0, 0), row
            assert bool(row["problems"]) == (origin is origins.sealed), row
            assert all("encrypted with key 'k1'" in problem for problem in row["problems"]), row
            assert f"{origin.topic}-{partition}" in err or origin is origins.plain
    assert rows == {}

    keyed = write_properties(tmp_path / "keyed.properties",
                             {**settings, "remote.log.storage.encryption.keys": encryption_keys({"k1": origins.k1})})
    assert await asyncio.to_thread(main, ["status", "--config", str(keyed), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (k1,) = report["encryption_keys"]
    assert (k1["key_id"], k1["segments"]) == ("k1", sum(p["remote_segments"] for p in report["partitions"]
                                                        if p["topic"] == origins.sealed.topic))
    assert k1["segments"] >= PARTITIONS
