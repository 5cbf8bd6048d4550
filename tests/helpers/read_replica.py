"""Read replicas in tests: topics tiered by the pipeline on one cluster (the origin) into a
bucket, read through a proxy in front of another cluster (the replica) as a SASL user."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from testbed.fixtures import SASL_USERS
from testbed.kafka import KafkaCluster
from tierproxy.config import Config
from tierproxy.pipeline.tier import run_pass
from tests.helpers.consume import record_keys
from tests.helpers.pipeline import assert_clean, tier_config
from tests.helpers.produce import ProducedRecord, produce_timed
from tests.helpers.proxy import ProxyThread

STEP_MS = 10
# Everything below the last stable offset is shipped, and trimmed from the origin's broker.
TOPIC_SETTINGS = {"segment.ms": 1, "local.retention.ms": 0, "segment.bytes": 16 * 1024}


class Origin:
    """A topic on the origin cluster and the pipeline configuration that tiers it."""

    def __init__(self, cluster: KafkaCluster, topic: str, partitions: int, store: Mapping[str, str],
                 root: Path) -> None:
        self.cluster = cluster
        self.topic = topic
        self.partitions = partitions
        self.records: list[ProducedRecord] = []
        self.config: Config = tier_config(root, cluster.bootstrap_servers, topic, topic_settings=TOPIC_SETTINGS,
                                          extra=store)

    def produce(self, per_partition: int) -> None:
        # Stamped in the past, so that the pass sees even the last segment as older than segment.ms.
        first = int(time.time() * 1000) - per_partition * STEP_MS - 1000
        self.records += produce_timed({"bootstrap.servers": self.cluster.bootstrap_servers}, self.topic,
                                      self.partitions, per_partition, value_size=100, base_timestamp_ms=first,
                                      step_ms=STEP_MS)
        self.records.sort(key=lambda r: (r.partition, r.offset))

    def tier(self, spark) -> None:
        assert_clean(run_pass(self.config, spark))

    def ends(self) -> dict[int, int]:
        """Each partition's log end offset: the count of its records."""
        return {p: sum(1 for r in self.records if r.partition == p) for p in range(self.partitions)}


def replica_settings(origin: Origin, metadata: Mapping[str, str], *topics: str) -> dict[str, str]:
    """The replica cluster's side of the configuration: the origin's store, read only, with the
    replica's remote log metadata keys; `topics` (the origin's topic if none) are replicas."""
    return {key: value for key, value in origin.config.raw().items()
            if key.startswith("remote.log.storage.")} | dict(metadata) | {
        f"topic.{topic}.remote.log.read.replica": "true" for topic in topics or (origin.topic,)}


def sasl(user: str) -> dict[str, str]:
    """aiokafka's settings for `user` on the SASL cluster."""
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_plain_username": user,
            "sasl_plain_password": SASL_USERS[user]}


async def replay(proxy: ProxyThread, topic: str, partitions: int, count: int, **options) -> list[tuple]:
    """alice's records from offset 0, until `count` or 60 s, sorted by (partition, offset)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=proxy.bootstrap_servers, auto_offset_reset="earliest",
                                enable_auto_commit=False, **sasl("alice"), **options)
    await consumer.start()
    records = []
    try:
        deadline = time.monotonic() + 60
        while len(records) < count and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records.extend(batch)
        if "group_id" in options:
            await consumer.commit()
            committed = {p: await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)}
            assert committed == {p: sum(1 for r in records if r.partition == p) for p in range(partitions)}
    finally:
        await consumer.stop()
    return sorted(record_keys(records), key=lambda k: (k[0], k[1]))
