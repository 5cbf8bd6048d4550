"""Crashes during a tiering pass: a task attempt failing in the middle of an upload (Spark
retries it), and a driver that died after its tasks uploaded. Afterwards: no overlap, no
gap, no FINISHED segment without its objects, and every orphan went through the DELETE
states with its objects removed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tierproxy.client.cluster import Cluster
from tierproxy.pipeline.copy import InjectedFailure, metadata_manager, run_copy
from tierproxy.pipeline.plan import plan_pass
from tierproxy.pipeline.tier import run_pass
from tierproxy.config import Config
from tierproxy.storage.factory import remote_storage_manager
from tierproxy.storage.metadata.file_store import LOG_FILE_NAME, scan_entries
from tierproxy.storage.model import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tierproxy.storage.rsm import kafka_uuid
from tests.helpers.produce import produce_mixed
from tests.helpers.pipeline import BROKER_SEGMENT_BYTES, check_remote_log, tier_config

S = RemoteLogSegmentState
SMALL_SEGMENT_BYTES = 32 * 1024
# A segment is 6 objects (log, 3 indexes, leader-epoch checkpoint, manifest) or 7: failing
# after 8 lets the first segment complete and breaks the second half-way.
FAIL_AFTER_OBJECTS = 8


def history(config: Config) -> list:
    """Every metadata record ever appended, in order."""
    records, _ = scan_entries((Path(config["remote.log.metadata.dir"]) / LOG_FILE_NAME).read_bytes())
    return records


def states(config: Config) -> dict:
    """segment id -> (metadata as added, every state it went through)."""
    out: dict = {}
    for record in history(config):
        if isinstance(record, RemoteLogSegmentMetadata):
            out[record.segment_id] = (record, [record.state])
        elif isinstance(record, RemoteLogSegmentMetadataUpdate):
            out[record.segment_id][1].append(record.state)
    return out


def segment_of_key(key: str) -> str:
    name = key.rsplit("/", 1)[1]  # <20-digit start offset>-<segment id>.<ext>
    return name[21:].rsplit(".", 1)[0]


async def assert_orphans_cleaned(config: Config, topic: str) -> dict:
    """Every segment ever added is FINISHED with its objects, or went STARTED -> DELETE_STARTED
    -> DELETE_FINISHED and left no object behind. Returns the history by segment id."""
    segments = states(config)
    finished = {sid for sid, (_, seen) in segments.items() if seen[-1] == S.COPY_SEGMENT_FINISHED}
    for sid, (_, seen) in segments.items():
        if sid not in finished:
            assert seen == [S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED], seen
    async with remote_storage_manager(config) as rsm, Cluster.from_config(config) as cluster:
        info = (await cluster.topics([topic]))[topic]
        for p in info.partitions:
            tp = TopicIdPartition(info.topic_id, topic, p)
            stored = {segment_of_key(k) for k in await rsm.list_partition_objects(tp)}
            assert stored == {kafka_uuid(sid.id) for sid in finished if sid.topic_id_partition == tp}
    return segments


async def produce(kafka_cluster, topic) -> tuple[str, str]:
    name = topic(partitions=3, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
    await produce_mixed(kafka_cluster.bootstrap_servers, name, 3, per_codec=2_000, per_transaction=100)
    return kafka_cluster.bootstrap_servers, name


async def test_a_task_attempt_failing_mid_upload_is_retried_and_its_segments_cleaned(
        spark, kafka_cluster, topic, tmp_path):
    bootstrap, name = await produce(kafka_cluster, topic)
    config = tier_config(tmp_path, bootstrap, name, topic_settings={"segment.bytes": SMALL_SEGMENT_BYTES},
                         extra={"pipeline.test.fail.after.objects": FAIL_AFTER_OBJECTS})
    report = await asyncio.to_thread(run_pass, config, spark)
    assert report.ok, report.errors
    finished = await check_remote_log(config, name, tail_may_wait=True)
    segments = await assert_orphans_cleaned(config, name)
    for p, winners in finished.items():
        assert len(winners) >= 2
        # The failed first attempt left two STARTED segments: one complete, one half uploaded.
        assert report.partitions[p].cleaned == 2
        losers = [m for m, seen in segments.values()
                  if m.topic_id_partition.partition == p and seen[-1] == S.DELETE_SEGMENT_FINISHED]
        assert [m.start_offset for m in losers] == [winners[0].start_offset, winners[1].start_offset]


async def test_a_crashed_driver_leaves_started_segments_that_the_next_pass_cleans(
        spark, kafka_cluster, topic, tmp_path):
    bootstrap, name = await produce(kafka_cluster, topic)
    config = tier_config(tmp_path, bootstrap, name, topic_settings={"segment.bytes": SMALL_SEGMENT_BYTES})
    failing = config.with_overrides({"pipeline.test.fail.after.objects": str(FAIL_AFTER_OBJECTS)})

    # The tasks of a pass whose driver died before committing: partition 0 uploaded its
    # whole range, partition 1 failed half-way; nothing was marked FINISHED.
    async with Cluster.from_config(config) as cluster, metadata_manager(config) as rlmm:
        plans = await plan_pass(config, cluster, rlmm)
    complete = await run_copy(config, plans[0])
    assert len(complete.segments) >= 2
    with pytest.raises(InjectedFailure):
        await run_copy(failing, plans[1], attempt=0)
    left = states(config)
    assert {seen[-1] for _, seen in left.values()} == {S.COPY_SEGMENT_STARTED}
    assert len(left) == len(complete.segments) + 2

    report = await asyncio.to_thread(run_pass, config, spark)
    assert report.ok, report.errors
    assert [p.cleaned for p in report.partitions] == [len(complete.segments), 2, 0]
    await check_remote_log(config, name, tail_may_wait=True)
    segments = await assert_orphans_cleaned(config, name)
    orphans = {m.segment_id for m in complete.metadata()}
    assert all(segments[sid][1][-1] == S.DELETE_SEGMENT_FINISHED for sid in orphans)
