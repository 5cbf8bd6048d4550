"""A pass with one broker of three down: only the partitions it leads fail (named in the
summary); the others are copied, committed and trimmed. On a cluster of its own, since a
node is killed."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from testbed.fixtures import _test_broker_config
from testbed.kafka import KafkaCluster
from tierproxy.client.cluster import Cluster
from tierproxy.pipeline.tier import run_pass, summary_json
from tests.helpers.pipeline import tier_config
from tests.helpers.produce import produce_codecs

pytestmark = pytest.mark.timeout(300)


async def test_one_unreachable_broker_fails_only_the_partitions_it_leads(spark, tmp_path):
    with KafkaCluster(3, broker_config=_test_broker_config()) as kafka:
        name = "down"
        kafka.create_topic(name, partitions=3, config={"internal.segment.bytes": 16 * 1024})
        await produce_codecs(kafka.bootstrap_servers, name, 3, 20)
        async with Cluster(kafka.bootstrap_servers.split(",")) as cluster:
            leaders = {p: info.leader for p, info in (await cluster.topics([name]))[name].partitions.items()}
        assert sorted(leaders.values()) == [0, 1, 2], leaders  # one partition per node
        (down,) = [p for p, node in leaders.items() if node == 2]
        os.kill(kafka.pids[2], signal.SIGKILL)

        # segment.ms=1 ships everything below the last stable offset; local.retention.ms=0 trims it.
        config = tier_config(tmp_path, kafka.bootstrap_servers, name,
                             topic_settings={"segment.ms": 1, "local.retention.ms": 0})
        report = await asyncio.to_thread(run_pass, config, spark)

        up = sorted(p for p in leaders if p != down)
        assert [p.plan.partition for p in report.partitions] == up
        document = summary_json(report)
        for p in document["partitions"]:
            assert p["error"] is None and p["segments"] > 0, p
            assert p["trimmed_to"] == p["copied_range"][1], p
        assert document["ok"] is False
        # Every error is the down partition's: not planned, and not trimmed by local retention.
        assert document["errors"][0].startswith(
            f"{name}-{down}: not planned: LeaderUnavailable: ListOffsets EARLIEST of {name}-{down}: leader 2: "), \
            document["errors"]
        assert all(f" {name}-{down}" in f" {e}" for e in document["errors"]), document["errors"]
        assert not [e for e in document["errors"] for p in up if f"{name}-{p}" in e], document["errors"]
