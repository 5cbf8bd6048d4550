"""`tierproxy replica create` gives each replica topic the origin's partition count, as the
origin's pipeline publishes it with the remote log metadata, not the partitions tiered so far.

On the origin (the session's cluster) `wide` has six partitions of which only 0-2 hold
records when the pipeline tiers it into moto's S3; `pair-<n>` two and `single-<n>` one, all
with records, one couple per round of `replica create` of two topics at once. The replica cluster is the SASL one, reached through its PLAINTEXT inter-broker
listener; its file reads the remote log metadata the pipeline published into the bucket.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tierproxy.cli import main
from tierproxy.client.cluster import Cluster
from tierproxy.pipeline.copy import metadata_manager
from tierproxy.storage.factory import remote_storage_manager
from tierproxy.storage.metadata.bucket import HEAD, BucketMetadata, Head
from tests.helpers.commands import write_properties
from tests.helpers.produce import produce_timed
from tests.helpers.read_replica import STEP_MS, TOPIC_SETTINGS, Origin, replica_settings
from tests.helpers.tiered import plaintext_bootstrap

pytestmark = pytest.mark.timeout(600)

WIDE = 6
TIERED = 3  # wide's partitions with records when it is tiered: 0-2
SMALL = {"pair": 2, "single": 1}
# Fresh topics each round: a single look at the metadata right after CreateTopics missed one
# of a couple in more than half of such rounds.
ROUNDS = 6
PER_PARTITION = 60


@dataclasses.dataclass(frozen=True)
class Topics:
    origin: Origin  # `wide`, and the pipeline's configuration tiering all three
    small: list[dict[str, int]]  # per round, name -> partitions, every one with records

    @property
    def wide(self) -> str:
        return self.origin.topic


@pytest.fixture(scope="module")
def origin(spark, s3_server, kafka_cluster, tmp_path_factory) -> Iterator[Topics]:
    suffix = uuid.uuid4().hex[:8]
    wide = f"wide-{suffix}"
    small = [{f"{stem}-{n}-{suffix}": partitions for stem, partitions in SMALL.items()} for n in range(ROUNDS)]
    every_small = {name: partitions for couple in small for name, partitions in couple.items()}
    store = {**s3_server.storage_properties(f"replica-create-{suffix}"), "remote.log.metadata.backend": "file",
             "remote.log.metadata.dir": str(tmp_path_factory.mktemp("metadata"))}
    for name in every_small:
        store |= {f"topic.{name}.remote.storage.enable": "true"} | {
            f"topic.{name}.{key}": str(value) for key, value in TOPIC_SETTINGS.items()}
    kafka_cluster.create_topic(wide, partitions=WIDE)
    for name, partitions in every_small.items():
        kafka_cluster.create_topic(name, partitions=partitions)
    try:
        # Origin produces into partitions 0..TIERED-1 of wide only.
        topics = Topics(Origin(kafka_cluster, wide, TIERED, store, tmp_path_factory.mktemp("origin")), small)
        topics.origin.produce(PER_PARTITION)
        first = int(time.time() * 1000) - PER_PARTITION * STEP_MS - 1000
        for name, partitions in every_small.items():
            produce_timed({"bootstrap.servers": kafka_cluster.bootstrap_servers}, name, partitions, PER_PARTITION,
                          value_size=100, base_timestamp_ms=first, step_ms=STEP_MS)
        topics.origin.tier(spark)
        yield topics
    finally:
        for name in [wide, *every_small]:
            kafka_cluster.delete_topic(name)


@pytest.fixture(scope="module")
def replica_metadata(tmp_path_factory) -> dict[str, str]:
    return {"remote.log.metadata.backend": "remote",
            "remote.log.metadata.dir": str(tmp_path_factory.mktemp("replica-metadata")),
            "remote.log.replica.refresh.interval.ms": "1000"}


def _replica_file(origin: Topics, metadata: dict[str, str], sasl_kafka, path: Path, *topics: str) -> Path:
    return write_properties(path, {**replica_settings(origin.origin, metadata, *topics),
                                   "bootstrap.servers": plaintext_bootstrap(sasl_kafka)})


async def _partitions(cluster, names) -> dict[str, int]:
    """The replica cluster's partition count of each of `names` that exists."""
    async with Cluster(plaintext_bootstrap(cluster).split(",")) as admin:
        return {name: len(info.partitions) for name, info in (await admin.topics(names)).items()}


def _replica_create(path: Path) -> int:
    return main(["replica", "create", "--config", str(path)])


async def test_the_pipeline_publishes_each_tiered_topics_partition_count_with_the_metadata(origin):
    async with remote_storage_manager(origin.origin.config) as rsm:
        head = await BucketMetadata(rsm).head()
    assert head is not None
    assert head.topic_partitions == {origin.wide: WIDE} | {n: c for couple in origin.small for n, c in couple.items()}
    async with metadata_manager(origin.origin.config) as rlmm:
        assert {tp.partition for tp in rlmm.partitions() if tp.topic == origin.wide} == set(range(TIERED))


async def test_replica_create_gives_the_origins_partition_count_not_the_tiered_partitions(
        origin, replica_metadata, sasl_kafka, tmp_path, capsys):
    path = _replica_file(origin, replica_metadata, sasl_kafka, tmp_path / "replica.properties", origin.wide)
    try:
        assert await asyncio.to_thread(_replica_create, path) == 0
        assert await _partitions(sasl_kafka, [origin.wide]) == {origin.wide: WIDE}
    finally:
        sasl_kafka.delete_topic(origin.wide)
    assert f"{origin.wide}: created with {WIDE} partitions" in capsys.readouterr().out


async def test_a_replica_topic_with_fewer_partitions_is_a_status_problem_and_grows_keeping_group_offsets(
        origin, replica_metadata, sasl_kafka, tmp_path, capsys):
    """As `replica create` made it before the counts were published: with the partitions
    tiered then. Its group's committed offsets survive the partitions added."""
    path = _replica_file(origin, replica_metadata, sasl_kafka, tmp_path / "replica.properties", origin.wide)
    bootstrap = plaintext_bootstrap(sasl_kafka)
    group = f"readers-{uuid.uuid4().hex[:8]}"
    committed = {TopicPartition(origin.wide, p): 10 + p for p in range(TIERED)}
    sasl_kafka.create_topic(origin.wide, partitions=TIERED)
    try:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign(list(committed))
            await consumer.commit(committed)
        finally:
            await consumer.stop()

        assert await asyncio.to_thread(main, ["status", "--config", str(path)]) == 1
        problem = (f"read replica topic {origin.wide} has {TIERED} partitions on this cluster, the origin's {WIDE}: "
                   f"partitions {TIERED}-{WIDE - 1} are never served; `tierproxy replica create` adds them")
        assert problem in capsys.readouterr().err

        assert await asyncio.to_thread(_replica_create, path) == 0
        assert f"{origin.wide}: {WIDE - TIERED} partitions added to its {TIERED}: {WIDE}, the origin's" in \
            capsys.readouterr().out
        assert await _partitions(sasl_kafka, [origin.wide]) == {origin.wide: WIDE}
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        assert {tp: meta.offset for tp, meta in offsets.items()} == committed

        assert await asyncio.to_thread(main, ["status", "--config", str(path)]) == 0
        assert problem not in capsys.readouterr().err
    finally:
        sasl_kafka.delete_topic(origin.wide)


async def test_replica_create_of_two_topics_at_once_waits_until_the_cluster_shows_them(
        origin, replica_metadata, sasl_kafka, tmp_path, capsys):
    """A broker learns of a topic a moment after the controller created it: one look at the
    metadata right after CreateTopics often misses one of two (exit 1 though both were
    made). A round per couple of topics."""
    for n, couple in enumerate(origin.small):
        path = _replica_file(origin, replica_metadata, sasl_kafka, tmp_path / f"replica-{n}.properties", *couple)
        try:
            assert await asyncio.to_thread(_replica_create, path) == 0, capsys.readouterr().err
            assert await _partitions(sasl_kafka, list(couple)) == couple
            out = capsys.readouterr().out
            assert all(f"{name}: created with {count} partitions" in out for name, count in couple.items())
        finally:
            for name in couple:
                sasl_kafka.delete_topic(name)


async def test_a_head_published_before_the_counts_falls_back_to_the_metadata_and_says_so(
        origin, replica_metadata, sasl_kafka, tmp_path, capsys):
    path = _replica_file(origin, replica_metadata, sasl_kafka, tmp_path / "replica.properties", origin.wide)
    async with remote_storage_manager(origin.origin.config) as rsm:
        key = BucketMetadata.key(HEAD)
        published = await rsm.get_object(key)
        await rsm.put_object(key, dataclasses.replace(Head.decode(published), topic_partitions=None).encode())
        try:
            assert await asyncio.to_thread(_replica_create, path) == 0
            assert await _partitions(sasl_kafka, [origin.wide]) == {origin.wide: TIERED}
        finally:
            await rsm.put_object(key, published)
            sasl_kafka.delete_topic(origin.wide)
    out, err = capsys.readouterr()
    assert f"{origin.wide}: created with {TIERED} partitions" in out
    assert (f"warning: {origin.wide}: the remote store publishes no partition count of the origin's topic" in err
            and f"{TIERED}, the partitions its remote log metadata knows, stands in" in err)
