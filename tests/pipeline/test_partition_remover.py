"""Partition removal: the remote data of a topic deleted from the real broker."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from tierproxy.client.cluster import Cluster
from tierproxy.pipeline.partition_remover import STATE_FILE_NAME, last_run_ms
from tierproxy.pipeline.retention import run_retention
from tierproxy.storage.indexes import write_segment_files
from tierproxy.storage.model import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

from tests.helpers.retention import last_states, produce_groups, retention_config, stores, tier

INTERVAL_MS = 3_600_000


async def test_deleted_topic_is_removed_and_other_data_untouched(kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    deleted, kept = topic(partitions=2), topic()
    for name, partition in ((deleted, 0), (deleted, 1), (kept, 0)):
        await produce_groups(bootstrap, name, partition=partition, groups=2)
    config = retention_config(tmp_path, bootstrap, {deleted: {}, kept: {}},
                              **{"remote.partition.remover.task.interval.ms": str(INTERVAL_MS)})
    work = tmp_path / "work"
    async with stores(config) as (rlmm, rsm), Cluster(bootstrap.split(",")) as cluster:
        old = {p: await tier(bootstrap, rlmm, rsm, work, deleted, end=40, partition=p) for p in (0, 1)}
        kept_segments = await tier(bootstrap, rlmm, rsm, work, kept, end=40)
        old_tps = [old[p][0].topic_id_partition for p in (0, 1)]
        # Leftovers of failed copies: a segment never finished, and objects without any metadata.
        first = old[0][0]
        unfinished = dataclasses.replace(first, segment_id=RemoteLogSegmentId.generate(old_tps[0]),
                                         state=RemoteLogSegmentState.COPY_SEGMENT_STARTED)
        await rlmm.add_remote_log_segment_metadata(unfinished)
        orphan = dataclasses.replace(first, segment_id=RemoteLogSegmentId.generate(old_tps[0]))
        log_path = work / str(old_tps[0]) / "00000000000000000000.log"
        await rsm.copy_log_segment_data(orphan, write_segment_files(log_path, 0, tmp_path / "orphan"))
        objects = {tp: await rsm.list_partition_objects(tp) for tp in old_tps}
        kept_objects = await rsm.list_partition_objects(kept_segments[0].topic_id_partition)

        # Delete the topic, and create one with the same name (a new topic id) with remote data.
        await asyncio.to_thread(kafka_cluster.delete_topic, deleted)
        await asyncio.to_thread(kafka_cluster.create_topic, deleted, 1)
        await produce_groups(bootstrap, deleted, groups=1)
        recreated = await tier(bootstrap, rlmm, rsm, work / "recreated", deleted, end=20)
        new_tp = recreated[0].topic_id_partition
        assert new_tp.topic_id != old_tps[0].topic_id
        recreated_objects = await rsm.list_partition_objects(new_tp)

        now_ms = int(time.time() * 1000)
        report = await run_retention(config, cluster, rlmm, rsm, now_ms=now_ms)
        assert report.ok, report.failures
        assert report.partition_remover_ran
        assert [(r.topic_id_partition, r.segments, r.objects) for r in report.removed] == [
            (old_tps[0], 3, len(objects[old_tps[0]])), (old_tps[1], 2, len(objects[old_tps[1]])),
        ]
        states = last_states(rlmm)
        for tp in old_tps:
            assert await rsm.list_partition_objects(tp) == []
            assert rlmm.list_segments(tp) == []
            assert rlmm.partition_delete_state(tp) == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED
        for segment in [*old[0], unfinished, *old[1]]:
            assert states[segment.segment_id.id] == RemoteLogSegmentState.DELETE_SEGMENT_FINISHED
        # The other topic, and the new topic under the old name, keep everything.
        for tp, segments, keys in ((kept_segments[0].topic_id_partition, kept_segments, kept_objects),
                                   (new_tp, recreated, recreated_objects)):
            assert await rsm.list_partition_objects(tp) == keys
            assert [s.segment_id for s in rlmm.list_segments(tp)] == [s.segment_id for s in segments]
            assert {s.state for s in rlmm.list_segments(tp)} == {RemoteLogSegmentState.COPY_SEGMENT_FINISHED}
            assert rlmm.partition_delete_state(tp) is None
            for segment in segments:
                await rsm.verify_segment(segment, check_crc=True)

        # The remover runs at most once per interval; a removed partition is not removed again.
        assert last_run_ms(tmp_path / "metadata" / STATE_FILE_NAME) == now_ms
        report = await run_retention(config, cluster, rlmm, rsm, now_ms=now_ms + INTERVAL_MS - 1)
        assert not report.partition_remover_ran and report.ok
        report = await run_retention(config, cluster, rlmm, rsm, now_ms=now_ms + INTERVAL_MS)
        assert report.partition_remover_ran and report.removed == [] and report.ok
        report = await run_retention(config, cluster, rlmm, rsm, now_ms=now_ms + INTERVAL_MS + 1,
                                     force_partition_removal=True)
        assert report.partition_remover_ran and report.removed == []


async def test_an_interrupted_removal_completes(kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic()
    await produce_groups(bootstrap, name, groups=2)
    config = retention_config(tmp_path, bootstrap, {})
    async with stores(config) as (rlmm, rsm), Cluster(bootstrap.split(",")) as cluster:
        segments = await tier(bootstrap, rlmm, rsm, tmp_path / "work", name, end=40)
        tp: TopicIdPartition = segments[0].topic_id_partition
        await asyncio.to_thread(kafka_cluster.delete_topic, name)
        # A run that stopped after marking the partition and starting the delete of one segment.
        await rlmm.put_partition_delete(RemotePartitionDeleteMetadata(
            tp, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 0, 0))
        await rlmm.put_partition_delete(RemotePartitionDeleteMetadata(
            tp, RemotePartitionDeleteState.DELETE_PARTITION_STARTED, 0, 0))
        await rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            segments[0].segment_id, 0, RemoteLogSegmentState.DELETE_SEGMENT_STARTED, 0))

        report = await run_retention(config, cluster, rlmm, rsm, now_ms=int(time.time() * 1000),
                                     force_partition_removal=True)
        assert report.ok, report.failures
        assert [(r.topic_id_partition, r.segments) for r in report.removed] == [(tp, 2)]
        assert await rsm.list_partition_objects(tp) == []
        assert rlmm.partition_delete_state(tp) == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED
        states = last_states(rlmm)
        assert [states[s.segment_id.id] for s in segments] == [RemoteLogSegmentState.DELETE_SEGMENT_FINISHED] * 2
