"""A read replica: a topic tiered by the pipeline on one cluster (the origin) and served by
a proxy in front of another cluster (the replica, SASL with Kafka's StandardAuthorizer),
both on one S3 bucket.

`tierproxy replica create` made the topic on the replica cluster, empty, with the origin's
partition count. alice may read it, carol only describe it, dave write it. alice replays
it exactly from offset 0 with the origin running and again, in a consumer group, after
the origin's broker is killed; a consumer at the end sees new segments the origin tiers;
dave's Produce is refused (INVALID_TOPIC_EXCEPTION; with acks=0 his connection is closed)
and nothing lands on the replica cluster; carol gets TOPIC_AUTHORIZATION_FAILED and no bytes.

The remote log metadata is one fixture (`metadata`): the replica reads the origin pipeline's
own file store, or (`remote`) what the pipeline publishes into the bucket.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import InvalidTopicError, TopicAuthorizationFailedError
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.fetch.v13 import request as fetch13
from kio.schema.list_offsets.v9 import request as list_offsets9
from kio.schema.offset_for_leader_epoch.v4 import request as epoch4
from kio.schema.produce.v9 import request as produce9
from kio.schema.produce.v13 import request as produce13
from confluent_kafka.admin import AclOperation, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from testbed.fixtures import SASL_USERS, _test_broker_config
from testbed.kafka import KafkaCluster
from tierproxy.cli import main
from tierproxy.client.cluster import Cluster
from tierproxy.client.connection import KafkaConnectionError
from tierproxy.protocol.apis import ErrorCode, OffsetSpec
from tierproxy.protocol.records import iter_batches
from tierproxy.protocol.requests import metadata_request
from tierproxy.replica import REPLICA_TOPIC_CONFIG
from tierproxy.storage.factory import remote_storage_manager
from tierproxy.storage.metadata.bucket import FOLDER, HEAD
from tests.helpers.acl import authenticated, consume_until_refused, fetch_at, grant, send_unanswered
from tests.helpers.batches import batch
from tests.helpers.commands import write_properties
from tests.helpers.consume import record_keys
from tests.helpers.proxy import ProxyThread, proxy_config, running
from tests.helpers.read_replica import Origin, replay, sasl
from tests.helpers.read_replica import replica_settings as replica_settings_of
from tests.helpers.tiered import plaintext_bootstrap
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(600)

PARTITIONS = 2
PER_PARTITION = 400
MORE = 50


@pytest.fixture(scope="module", params=["file", "remote"])
def metadata(request, tmp_path_factory) -> tuple[dict[str, str], dict[str, str]]:
    """The remote log metadata keys of the origin's pipeline, which writes it, and of the
    replica, which reads it: the pipeline's own store, or what it publishes into the bucket."""
    origin = {"remote.log.metadata.backend": "file", "remote.log.metadata.dir": str(tmp_path_factory.mktemp("metadata"))}
    if request.param == "file":
        return origin, origin
    return origin, {"remote.log.metadata.backend": "remote",
                    "remote.log.metadata.dir": str(tmp_path_factory.mktemp("replica-metadata")),
                    "remote.log.replica.refresh.interval.ms": "1000"}


@pytest.fixture(scope="module")
def origin(spark, s3_server, metadata, tmp_path_factory) -> Iterator[Origin]:
    topic = f"replicated-{uuid.uuid4().hex[:8]}"
    store = {**s3_server.storage_properties(topic), **metadata[0]}
    with KafkaCluster(1, broker_config=_test_broker_config()) as cluster:
        cluster.create_topic(topic, partitions=PARTITIONS)
        data = Origin(cluster, topic, PARTITIONS, store, tmp_path_factory.mktemp("origin"))
        data.produce(PER_PARTITION)
        data.tier(spark)
        yield data


@pytest.fixture(scope="module")
def replica_settings(origin, metadata) -> dict[str, str]:
    """The replica cluster's side of the configuration (its proxy's and `replica create`'s)."""
    return replica_settings_of(origin, metadata[1])


@pytest.fixture(scope="module")
def replica_file(replica_settings, sasl_kafka, tmp_path_factory) -> Path:
    """`tierproxy replica create`'s file: tierproxy's own connections use the cluster's
    PLAINTEXT inter-broker listener (a super user)."""
    return write_properties(tmp_path_factory.mktemp("replica") / "replica.properties",
                            {**replica_settings, "bootstrap.servers": plaintext_bootstrap(sasl_kafka)})


@pytest.fixture(scope="module")
def replica(origin, sasl_kafka, replica_settings, replica_file) -> Iterator[ProxyThread]:
    assert main(["replica", "create", "--config", str(replica_file)]) == 0
    grant(sasl_kafka, "alice", ResourceType.TOPIC, origin.topic, AclOperation.READ, AclOperation.DESCRIBE)
    grant(sasl_kafka, "alice", ResourceType.GROUP, "*", AclOperation.READ, AclOperation.DESCRIBE)
    grant(sasl_kafka, "carol", ResourceType.TOPIC, origin.topic, AclOperation.DESCRIBE)
    grant(sasl_kafka, "carol", ResourceType.GROUP, "*", AclOperation.READ)
    grant(sasl_kafka, "dave", ResourceType.TOPIC, origin.topic, AclOperation.WRITE, AclOperation.DESCRIBE)
    try:
        with running(proxy_config(sasl_kafka.bootstrap_servers, len(sasl_kafka.brokers), **replica_settings)) as proxy:
            yield proxy
    finally:
        sasl_kafka.delete_topic(origin.topic)


async def _replica_end_offsets(cluster: KafkaCluster, topic: str) -> dict[int, int]:
    """The replica cluster's own log end offsets of the topic, asked of its broker directly."""
    async with Cluster(plaintext_bootstrap(cluster).split(",")) as admin:
        topics = await admin.topics([topic])
        answers = await admin.list_offsets(topics, [(topic, p) for p in range(PARTITIONS)], OffsetSpec.LATEST)
    return {p: answers[(topic, p)].offset for p in range(PARTITIONS)}


def _remote_reads(proxy: ProxyThread, topic: str) -> float:
    return proxy.metrics.value("tierproxy_remote_read_requests_total", {"topic": topic})


async def test_replica_create_made_the_topic_empty_with_the_origins_partitions(origin, replica, sasl_kafka,
                                                                               replica_file):
    assert await _replica_end_offsets(sasl_kafka, origin.topic) == {p: 0 for p in range(PARTITIONS)}
    # Again: nothing to do.
    assert await asyncio.to_thread(main, ["replica", "create", "--config", str(replica_file)]) == 0


async def test_replica_create_refuses_a_topic_with_more_partitions_than_the_origins(origin, replica_settings,
                                                                                    kafka_cluster, tmp_path, capsys):
    """On a cluster where the topic exists with three partitions, more than the origin's two:
    Kafka removes no partition. (One with fewer gets the missing ones: test_replica_create.)"""
    more = PARTITIONS + 1
    kafka_cluster.create_topic(origin.topic, partitions=more)
    try:
        path = write_properties(tmp_path / "wrong.properties",
                                {**replica_settings, "bootstrap.servers": kafka_cluster.bootstrap_servers})
        assert await asyncio.to_thread(main, ["replica", "create", "--config", str(path)]) == 1
    finally:
        kafka_cluster.delete_topic(origin.topic)
    assert (f"{origin.topic} exists on this cluster with {more} partitions, more than the origin's {PARTITIONS}: "
            f"Kafka removes no partition, and partitions {PARTITIONS}-{more - 1} have no remote log") in \
        capsys.readouterr().err


async def test_alice_replays_the_topic_exactly_with_offsets_from_the_remote_log(origin, replica):
    assert await replay(replica, origin.topic, PARTITIONS, len(origin.records)) == record_keys(origin.records)
    assert _remote_reads(replica, origin.topic) > 0
    consumer = AIOKafkaConsumer(bootstrap_servers=replica.bootstrap_servers, **sasl("alice"))
    await consumer.start()
    try:
        partitions = [TopicPartition(origin.topic, p) for p in range(PARTITIONS)]
        ends = {tp.partition: offset for tp, offset in (await consumer.end_offsets(partitions)).items()}
        starts = {tp.partition: offset for tp, offset in (await consumer.beginning_offsets(partitions)).items()}
        middle = origin.records[PER_PARTITION // 2]
        by_time = await consumer.offsets_for_times({TopicPartition(origin.topic, middle.partition):
                                                    middle.timestamp_ms})
    finally:
        await consumer.stop()
    assert ends == {p: sum(1 for r in origin.records if r.partition == p) for p in range(PARTITIONS)}
    assert starts == {p: 0 for p in range(PARTITIONS)}
    (found,) = by_time.values()
    first = min(r.offset for r in origin.records
                if r.partition == middle.partition and r.timestamp_ms >= middle.timestamp_ms)
    assert found.offset == first


async def test_produce_to_the_replica_is_refused_and_never_lands(origin, replica, sasl_kafka):
    producer = AIOKafkaProducer(bootstrap_servers=replica.bootstrap_servers, **sasl("dave"))
    await producer.start()
    try:
        with pytest.raises(InvalidTopicError):
            await producer.send_and_wait(origin.topic, b"never", partition=0)
    finally:
        await producer.stop()
    assert await _replica_end_offsets(sasl_kafka, origin.topic) == {p: 0 for p in range(PARTITIONS)}


async def test_a_produce_with_another_topic_too_writes_only_that_one(origin, replica, sasl_kafka):
    """One Produce request for the replica topic and an ordinary one: the ordinary topic's
    partition is written, the replica's refused with a message saying why."""
    other = f"ordinary-{uuid.uuid4().hex[:8]}"
    sasl_kafka.create_topic(other)
    grant(sasl_kafka, "dave", ResourceType.TOPIC, other, AclOperation.WRITE, AclOperation.DESCRIBE)
    conn = await authenticated(replica.bootstrap_servers, "dave")
    try:
        response = await conn.request(produce9.ProduceRequest(
            transactional_id=None, acks=i16(-1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
            topic_data=tuple(produce9.TopicProduceData(name=name, partition_data=(produce9.PartitionProduceData(
                index=i32(0), records=batch(0, 3)),)) for name in (origin.topic, other))))
    finally:
        await conn.close()
        sasl_kafka.delete_topic(other)
    answers = {t.name: t.partition_responses[0] for t in response.responses}
    assert answers[other].error_code == ErrorCode.none
    assert answers[origin.topic].error_code == ErrorCode.invalid_topic_exception
    assert answers[origin.topic].error_message == f"{origin.topic} is a read replica of a remote log: it takes no writes"
    assert await _replica_end_offsets(sasl_kafka, origin.topic) == {p: 0 for p in range(PARTITIONS)}


async def test_a_produce_with_acks_0_closes_its_connection_and_never_lands(origin, replica, sasl_kafka):
    """acks=0 gets no response to carry INVALID_TOPIC_EXCEPTION: the proxy closes the
    connection (as a broker does) and forwards nothing, by name (aiokafka) and by topic id
    (Produce v13). The topic here lacks `replica create`'s max.message.bytes=0 (one made by
    hand), so only the proxy keeps the writes out. Other connections go on."""
    async with Cluster(plaintext_bootstrap(sasl_kafka).split(",")) as admin:
        topic_id = (await admin.topics([origin.topic]))[origin.topic].topic_id
    _topic_config(sasl_kafka, origin.topic, "max.message.bytes", None)
    closed = replica.metrics.value("tierproxy_connections_closed_total", {"reason": "refused"})
    try:
        producer = AIOKafkaProducer(bootstrap_servers=replica.bootstrap_servers, acks=0, **sasl("dave"))
        await producer.start()
        try:
            await producer.send_and_wait(origin.topic, b"never", partition=0)
            await wait_until(lambda: replica.metrics.value("tierproxy_connections_closed_total",
                                                           {"reason": "refused"}) > closed,
                             30, "the connection of an acks=0 Produce to a replica topic closed")
        finally:
            await producer.stop()
        conn = await authenticated(replica.bootstrap_servers, "dave")
        try:
            send_unanswered(conn, produce13.ProduceRequest(
                transactional_id=None, acks=i16(0), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
                topic_data=(produce13.TopicProduceData(topic_id=topic_id, partition_data=(
                    produce13.PartitionProduceData(index=i32(1), records=batch(0, 3)),)),)))
            with pytest.raises(KafkaConnectionError):
                await conn.request(metadata_request(()))
        finally:
            await conn.close()
        assert replica.metrics.value("tierproxy_connections_closed_total", {"reason": "refused"}) == closed + 2
        # Another connection is served as before.
        conn = await authenticated(replica.bootstrap_servers, "alice")
        try:
            (answer,) = (await conn.request(fetch_at(origin.topic, 0))).responses[0].partitions
        finally:
            await conn.close()
        assert answer.error_code == ErrorCode.none
        assert next(iter_batches(answer.records)).base_offset == 0
    finally:
        _topic_config(sasl_kafka, origin.topic, "max.message.bytes", REPLICA_TOPIC_CONFIG["max.message.bytes"])
    assert await _replica_end_offsets(sasl_kafka, origin.topic) == {p: 0 for p in range(PARTITIONS)}


def _topic_config(cluster: KafkaCluster, topic: str, key: str, value: str | None) -> None:
    """Set a topic's config key on `cluster`, or (None) remove it."""
    entry = ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET if value is not None
                        else AlterConfigOpType.DELETE)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    for future in cluster.admin().incremental_alter_configs([resource]).values():
        future.result(30)


async def test_without_read_carol_gets_topic_authorization_failed_and_no_bytes(origin, replica):
    before = _remote_reads(replica, origin.topic)
    consumer = AIOKafkaConsumer(origin.topic, bootstrap_servers=replica.bootstrap_servers, enable_auto_commit=False,
                                auto_offset_reset="earliest", **sasl("carol"))
    records = []
    with pytest.raises(TopicAuthorizationFailedError):
        await consume_until_refused(consumer, records)
    assert records == []
    assert _remote_reads(replica, origin.topic) == before


async def test_raw_fetch_of_offset_0_per_principal_by_name_and_by_topic_id(origin, replica, sasl_kafka):
    """Remote bytes for alice, TOPIC_AUTHORIZATION_FAILED and none for carol, also after
    alice's connection proved the partition (the second fetch may skip the broker); by
    topic id (v13+) the id is the replica cluster's."""
    async with Cluster(plaintext_bootstrap(sasl_kafka).split(",")) as admin:
        topic_id = (await admin.topics([origin.topic]))[origin.topic].topic_id
    by_id = fetch13.FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=100)), min_bytes=i32(1), max_bytes=i32(1 << 20),
        isolation_level=i8(0), topics=(fetch13.FetchTopic(topic_id=topic_id, partitions=(fetch13.FetchPartition(
            partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)),)),),
        forgotten_topics_data=())
    for user in ("carol", "alice", "carol"):
        conn = await authenticated(replica.bootstrap_servers, user)
        try:
            for request in (fetch_at(origin.topic, 0), fetch_at(origin.topic, 0), by_id, by_id):
                response = await conn.request(request)
                (answer,) = response.responses[0].partitions
                if user == "alice":
                    assert answer.error_code == ErrorCode.none, request
                    assert next(iter_batches(answer.records)).base_offset == 0
                    assert answer.high_watermark == PER_PARTITION
                else:
                    assert answer.error_code == ErrorCode.topic_authorization_failed, request
                    assert not answer.records
        finally:
            await conn.close()


async def test_the_first_partition_with_records_gets_one_whole_batch(origin, replica):
    """KIP-74: with a partition_max_bytes no batch fits, the first partition that has
    records gets one whole batch, whatever comes before it: here partition 0 at its log
    end (a replica partition answered at once, with nothing)."""
    conn = await authenticated(replica.bootstrap_servers, "alice")
    try:
        first = await conn.request(fetch_at(origin.topic, 0))
        end = first.responses[0].partitions[0].high_watermark
        partitions = (fetch12.FetchPartition(partition=i32(0), fetch_offset=i64(end), partition_max_bytes=i32(1)),
                      fetch12.FetchPartition(partition=i32(1), fetch_offset=i64(0), partition_max_bytes=i32(1)))
        request = dataclasses.replace(fetch_at(origin.topic, 0),
                                      topics=(fetch12.FetchTopic(topic=origin.topic, partitions=partitions),))
        for _ in range(3):  # and again on the same connection: no partition stays first
            response = await conn.request(request)
            answers = {int(p.partition_index): p for p in response.responses[0].partitions}
            assert answers[0].error_code == answers[1].error_code == ErrorCode.none
            assert not answers[0].records
            assert [b.base_offset for b in iter_batches(answers[1].records)] == [0]
    finally:
        await conn.close()


async def test_list_offsets_of_every_kind_are_the_remote_logs(origin, replica):
    """ListOffsets needs DESCRIBE (carol has it): the answers are the remote log's, the
    empty topic on the replica cluster has no say."""
    records = [r for r in origin.records if r.partition == 0]
    end = len(records)
    latest = max(records, key=lambda r: (r.timestamp_ms, -r.offset))
    specs = {OffsetSpec.LATEST: end, OffsetSpec.EARLIEST: 0, OffsetSpec.MAX_TIMESTAMP: latest.offset,
             OffsetSpec.EARLIEST_LOCAL_TIMESTAMP: end, OffsetSpec.LATEST_TIERED_TIMESTAMP: end - 1,
             records[10].timestamp_ms: records[10].offset, latest.timestamp_ms + 1: -1}
    conn = await authenticated(replica.bootstrap_servers, "carol")
    try:
        for isolation_level in (0, 1):
            for spec, offset in specs.items():
                partition = list_offsets9.ListOffsetsPartition(partition_index=i32(0), timestamp=i64(spec))
                response = await conn.request(list_offsets9.ListOffsetsRequest(
                    replica_id=i32(-1), isolation_level=i8(isolation_level),
                    topics=(list_offsets9.ListOffsetsTopic(name=origin.topic, partitions=(partition,)),)))
                (answer,) = response.topics[0].partitions
                assert (answer.error_code, answer.offset, answer.leader_epoch) == (ErrorCode.none, offset, -1), spec
    finally:
        await conn.close()


async def test_a_consumer_at_the_end_sees_new_segments(origin, replica, spark):
    consumer = AIOKafkaConsumer(origin.topic, bootstrap_servers=replica.bootstrap_servers, enable_auto_commit=False,
                                auto_offset_reset="latest", **sasl("alice"))
    await consumer.start()
    try:
        assert await consumer.getmany(timeout_ms=1000) == {}  # at the end: nothing
        ends = {p: sum(1 for r in origin.records if r.partition == p) for p in range(PARTITIONS)}
        await asyncio.to_thread(origin.produce, MORE)
        await asyncio.to_thread(origin.tier, spark)
        records = []
        deadline = time.monotonic() + 60
        while len(records) < PARTITIONS * MORE and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records.extend(batch)
    finally:
        await consumer.stop()
    assert sorted(record_keys(records)) == record_keys(r for r in origin.records if r.offset >= ends[r.partition])


async def test_offset_for_leader_epoch_answers_from_the_origins_epochs(origin, replica):
    """The records carry the origin's leader epochs: OffsetForLeaderEpoch (a consumer checking
    its position) is answered from the remote log's epoch history, as Kafka's leader-epoch
    cache would, not by the empty topic; the broker's authorization and fencing stay."""
    end = origin.ends()[0]
    conn = await authenticated(replica.bootstrap_servers, "alice")
    try:
        first = next(iter_batches((await conn.request(fetch_at(origin.topic, 0))).responses[0].partitions[0].records))
        epoch = first.partition_leader_epoch
        answers = {}
        for current, asked in ((-1, epoch), (-1, epoch + 1), (-1, -1), (1 << 20, epoch)):
            response = await conn.request(_epoch_request(origin.topic, current, asked))
            (answer,) = response.topics[0].partitions
            answers[(current, asked)] = (answer.error_code, answer.leader_epoch, answer.end_offset)
    finally:
        await conn.close()
    assert answers == {
        (-1, epoch): (ErrorCode.none, epoch, end),  # the latest epoch ends at the log end
        (-1, epoch + 1): (ErrorCode.none, -1, -1),  # past every epoch: UNDEFINED
        (-1, -1): (ErrorCode.none, -1, -1),
        (1 << 20, epoch): (ErrorCode.unknown_leader_epoch, -1, -1),  # fenced by the replica's broker
    }
    conn = await authenticated(replica.bootstrap_servers, "bob")
    try:
        (answer,) = (await conn.request(_epoch_request(origin.topic, -1, epoch))).topics[0].partitions
    finally:
        await conn.close()
    assert (answer.error_code, answer.leader_epoch, answer.end_offset) == \
        (ErrorCode.topic_authorization_failed, -1, -1)


def _epoch_request(topic: str, current_leader_epoch: int, leader_epoch: int) -> epoch4.OffsetForLeaderEpochRequest:
    """A consumer's OffsetForLeaderEpoch v4 for partition 0 of `topic`."""
    return epoch4.OffsetForLeaderEpochRequest(replica_id=i32(-1), topics=(epoch4.OffsetForLeaderTopic(
        topic=topic, partitions=(epoch4.OffsetForLeaderPartition(
            partition=i32(0), current_leader_epoch=i32(current_leader_epoch), leader_epoch=i32(leader_epoch)),)),))


async def test_a_java_group_restarts_exactly_at_its_committed_offsets(origin, replica, sasl_kafka):
    """A Java consumer validates a committed position that carries a leader epoch (the
    origin's) with OffsetForLeaderEpoch: the second run of the group goes on exactly where
    the first committed, neither reset (auto.offset.reset) nor back to a "truncation"."""
    group = f"restart-{uuid.uuid4().hex[:6]}"
    everything = sorted((r.partition, r.offset, r.key.decode()) for r in origin.records)
    first = await _java_group_run(replica, sasl_kafka, origin.topic, group, len(everything) // 3)  # mid-partition
    assert first and all(line in everything for line in first)
    second = await _java_group_run(replica, sasl_kafka, origin.topic, group, len(everything) - len(first))
    assert sorted(first + second) == everything


async def _java_group_run(replica: ProxyThread, cluster: KafkaCluster, topic: str, group: str,
                          count: int) -> list[tuple[int, int, str]]:
    """The console consumer in `group` (earliest where nothing is committed) until `count`
    records; it commits what it consumed when it stops. One record per poll: what it consumed
    is what it printed."""
    java = await asyncio.to_thread(
        cluster.java_tool, "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server", replica.bootstrap_servers, "--consumer.config", str(cluster.client_properties("alice")),
        "--topic", topic, "--group", group, "--from-beginning", "--max-messages", str(count), "--timeout-ms", "30000",
        "--consumer-property", "max.poll.records=1",
        "--property", "print.partition=true", "--property", "print.offset=true", "--property", "print.key=true",
        "--property", "print.value=false", timeout=180)
    assert java.returncode == 0, java.stderr[-2000:]  # a TimeoutException: it did not get `count`
    return [_java_record(line) for line in java.stdout.splitlines() if line.startswith("Partition:")]


async def test_without_the_origin_a_group_replays_everything_exactly_once(origin, replica, sasl_kafka):
    os.kill(origin.cluster.pids[0], signal.SIGKILL)
    replayed = await replay(replica, origin.topic, PARTITIONS, len(origin.records), group_id=f"g-{uuid.uuid4().hex[:6]}")
    assert replayed == record_keys(origin.records)
    # librdkafka too, to the end of each partition.
    kcat = await asyncio.to_thread(subprocess.run, [
        "kcat", "-b", replica.bootstrap_servers, "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=PLAIN",
        "-X", "sasl.username=alice", "-X", f"sasl.password={SASL_USERS['alice']}", "-C", "-t", origin.topic,
        "-o", "beginning", "-e", "-q", "-f", "%p %o %k\\n"], capture_output=True, text=True, timeout=120)
    assert kcat.returncode == 0, kcat.stderr
    printed = sorted((int(p), int(o), k) for p, o, k in (line.split(" ") for line in kcat.stdout.splitlines() if line))
    assert printed == sorted((r.partition, r.offset, r.key.decode()) for r in origin.records)
    # The Java consumer in a group: fetch sessions and topic ids (Fetch v13+).
    java = await asyncio.to_thread(
        sasl_kafka.java_tool, "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server", replica.bootstrap_servers, "--consumer.config", str(sasl_kafka.client_properties("alice")),
        "--topic", origin.topic, "--group", f"java-{uuid.uuid4().hex[:6]}", "--from-beginning",
        "--max-messages", str(len(origin.records)), "--timeout-ms", "60000",
        "--property", "print.partition=true", "--property", "print.offset=true", "--property", "print.key=true",
        "--property", "print.value=false", timeout=180)
    assert java.returncode == 0, java.stderr[-2000:]
    assert sorted(_java_record(line) for line in java.stdout.splitlines() if line.startswith("Partition:")) == \
        sorted((r.partition, r.offset, r.key.decode()) for r in origin.records)


def _java_record(line: str) -> tuple[int, int, str]:
    """(partition, offset, key) of a console consumer line `Partition:P\tOffset:O\tKEY`."""
    fields = line.split("\t")
    named = dict(field.split(":", 1) for field in fields[:-1])
    return int(named["Partition"]), int(named["Offset"]), fields[-1]


# Issue 33: remote log metadata that is not there, or damaged (these run after the origin is
# gone: the bucket and the replica cluster are all they need).

_RNA = ErrorCode.replica_not_available
_UNREADABLE = "tierproxy_remote_log_metadata_unreadable"


def _looking_elsewhere(settings: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The replica's settings with its remote log metadata looked for where there is none:
    a key prefix with a typo (remote backend), or an empty metadata directory (file)."""
    if settings["remote.log.metadata.backend"] == "remote":
        return {**settings, "remote.log.storage.key.prefix": settings["remote.log.storage.key.prefix"] + "-typo"}
    return {**settings, "remote.log.metadata.dir": str(tmp_path / "empty")}


async def _answers(proxy: ProxyThread, topic: str, user: str = "alice") -> tuple[int, int, int, bool]:
    """Partition 0 of `topic` through `proxy`: the error codes of Fetch at 0, ListOffsets -1
    and OffsetForLeaderEpoch of epoch 0, and whether the Fetch carried records."""
    conn = await authenticated(proxy.bootstrap_servers, user)
    try:
        (fetched,) = (await conn.request(fetch_at(topic, 0))).responses[0].partitions
        response = await conn.request(list_offsets9.ListOffsetsRequest(
            replica_id=i32(-1), isolation_level=i8(0), topics=(list_offsets9.ListOffsetsTopic(name=topic, partitions=(
                list_offsets9.ListOffsetsPartition(partition_index=i32(0), timestamp=i64(OffsetSpec.LATEST)),)),)))
        (latest,) = response.topics[0].partitions
        (epoch,) = (await conn.request(_epoch_request(topic, -1, 0))).topics[0].partitions
    finally:
        await conn.close()
    return fetched.error_code, latest.error_code, epoch.error_code, bool(fetched.records)


async def _status(settings: dict[str, str], cluster: KafkaCluster, path: Path, capsys) -> tuple[int, str]:
    write_properties(path, {**settings, "bootstrap.servers": plaintext_bootstrap(cluster)})
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["status", "--config", str(path)])
    return code, capsys.readouterr().err


async def test_a_replica_whose_metadata_is_not_there_answers_replica_not_available(origin, replica, replica_settings,
                                                                                    sasl_kafka, tmp_path, capsys):
    """A key prefix with a typo (or an empty metadata directory) served every partition as an
    empty log: ListOffsets -1 answered 0 with no error, and a group's commits went to 0. Now
    Fetch, ListOffsets and OffsetForLeaderEpoch answer REPLICA_NOT_AVAILABLE, the group keeps
    its commits, the gauge says it, and status exits 1 naming where it looked."""
    group = f"kept-{uuid.uuid4().hex[:6]}"
    partitions = [TopicPartition(origin.topic, p) for p in range(PARTITIONS)]
    committer = AIOKafkaConsumer(bootstrap_servers=replica.bootstrap_servers, group_id=group,
                                 enable_auto_commit=False, **sasl("alice"))
    await committer.start()
    try:
        committer.assign(partitions)
        await committer.commit({tp: PER_PARTITION // 2 for tp in partitions})
    finally:
        await committer.stop()
    elsewhere = _looking_elsewhere(replica_settings, tmp_path)
    with running(proxy_config(sasl_kafka.bootstrap_servers, len(sasl_kafka.brokers), **elsewhere)) as proxy:
        assert await _answers(proxy, origin.topic) == (_RNA, _RNA, _RNA, False)
        consumer = AIOKafkaConsumer(origin.topic, bootstrap_servers=proxy.bootstrap_servers, group_id=group,
                                    auto_offset_reset="earliest", auto_commit_interval_ms=100, **sasl("alice"))
        await consumer.start()
        try:
            assert await consumer.getmany(timeout_ms=3000) == {}
        finally:
            await consumer.stop()  # commits its positions
        remote = elsewhere["remote.log.metadata.backend"] == "remote"
        assert proxy.metrics.value(_UNREADABLE, {"problem": "no_metadata"}) == (1 if remote else 0)
    checker = AIOKafkaConsumer(bootstrap_servers=replica.bootstrap_servers, group_id=group,
                               enable_auto_commit=False, **sasl("alice"))
    await checker.start()
    try:
        assert {tp.partition: await checker.committed(tp) for tp in partitions} == \
            {p: PER_PARTITION // 2 for p in range(PARTITIONS)}
    finally:
        await checker.stop()
    code, err = await _status(elsewhere, sasl_kafka, tmp_path / "elsewhere.properties", capsys)
    assert code == 1
    if remote:
        bucket = elsewhere["remote.log.storage.s3.bucket"]
        prefix = elsewhere["remote.log.storage.key.prefix"]
        assert f"no remote log metadata under s3://{bucket}/{prefix}/__remote_log_metadata/" in err
    else:
        assert f"the remote log metadata names no partition 0 of {origin.topic}" in err


async def test_damaged_metadata_neither_stops_a_proxy_nor_takes_its_last_good_state(origin, replica, replica_settings,
                                                                                    sasl_kafka, tmp_path, capsys):
    """A head that does not decode made `serve` fail at start, every topic behind it down.
    Now a proxy starts and serves its other topics, its replica partitions answer
    REPLICA_NOT_AVAILABLE; one that had read the metadata whole goes on serving it; both
    say so in the gauge, and status exits 1 naming the object."""
    settings = {**replica_settings, "remote.log.metadata.backend": "remote",
                "remote.log.metadata.dir": str(tmp_path / "metadata"),
                "remote.log.replica.refresh.interval.ms": "200"}
    config = proxy_config(sasl_kafka.bootstrap_servers, len(sasl_kafka.brokers), **settings)
    other = f"ordinary-{uuid.uuid4().hex[:8]}"
    sasl_kafka.create_topic(other)
    grant(sasl_kafka, "alice", ResourceType.TOPIC, other, AclOperation.READ, AclOperation.DESCRIBE)
    producer = AIOKafkaProducer(bootstrap_servers=plaintext_bootstrap(sasl_kafka))
    await producer.start()
    try:
        await producer.send_and_wait(other, b"ordinary", partition=0)
    finally:
        await producer.stop()
    head_key = f"{FOLDER}/{HEAD}"
    try:
        async with remote_storage_manager(config) as rsm:
            good = await rsm.get_object(head_key)
            with running(config) as last_good:
                assert (await _answers(last_good, origin.topic))[3]
                await rsm.put_object(head_key, b"{not json")
                try:
                    with running(config) as fresh:
                        assert await _answers(fresh, origin.topic) == (_RNA, _RNA, _RNA, False)
                        served = (ErrorCode.none,) * 3 + (True,)
                        deadline = time.monotonic() + 30  # alice's new ACL may take the broker a moment
                        while (answers := await _answers(fresh, other)) != served and time.monotonic() < deadline:
                            await asyncio.sleep(0.2)
                        assert answers == served
                        assert fresh.metrics.value(_UNREADABLE, {"problem": "damaged"}) == 1
                    await wait_until(lambda: last_good.metrics.value(_UNREADABLE, {"problem": "damaged"}) == 1,
                                     30, "the proxy that read the metadata whole sees the damaged head")
                    assert (await _answers(last_good, origin.topic))[::3] == (ErrorCode.none, True)
                    code, err = await _status(settings, sasl_kafka, tmp_path / "damaged.properties", capsys)
                    assert code == 1
                    assert f"{rsm.object_location(head_key)} cannot be read" in err
                finally:
                    await rsm.put_object(head_key, good)
                await wait_until(lambda: last_good.metrics.value(_UNREADABLE, {"problem": "damaged"}) == 0,
                                 30, "the mended head read again")
    finally:
        sasl_kafka.delete_topic(other)
