"""KIP-950 per topic, end to end with the real broker, the pipeline and the proxy.

One topic goes through Kafka's three steps while a second one keeps being tiered in the
same passes:

1. `remote.log.copy.disable=true`: nothing new is copied, the remote segments are still
   served through the proxy and still expire by retention (Kafka requires local
   retention to equal retention then, with its own message);
2. `remote.storage.enable=false` alone: refused with Kafka's message, nothing deleted,
   the other topic's copy goes on;
3. with `remote.log.delete.on.disable=true`: its remote data and metadata are deleted,
   and the proxy serves nothing of it any more: a consumer from offset 0 is reset to the
   broker's log start.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tierproxy.client.cluster import Cluster
from tierproxy.config import ConfigError, Config, parse
from tierproxy.pipeline.copy import metadata_manager
from tierproxy.pipeline.remote_storage_disable import DISABLE_WITHOUT_DELETE
from tierproxy.pipeline.tier import PassReport, run_pass
from tierproxy.protocol.apis import OffsetSpec
from tierproxy.storage.factory import remote_storage_manager
from tierproxy.storage.model import RemoteLogSegmentState, RemotePartitionDeleteState, TopicIdPartition
from tests.helpers.commands import SPARK_ENV, TIERPROXY, write_properties
from tests.helpers.consume import consume_confluent_assigned
from tests.helpers.pipeline import BROKER_SEGMENT_BYTES, finished_segments
from tests.helpers.produce import produce_codecs, until_older
from tests.helpers.proxy import ProxyThread, proxy_config
from tests.helpers.wait import wait_until

PARTITIONS = 2


def _properties(tmp_path: Path, bootstrap: str, subject: str, other: str, **subject_settings: Any) -> dict[str, str]:
    properties = {
        "bootstrap.servers": bootstrap, "spark.master": "local[2]", "metrics.port": "0",
        "remote.log.storage.local.dir": str(tmp_path / "remote"), "remote.log.metadata.dir": str(tmp_path / "metadata"),
    }
    for name in (subject, other):
        properties |= {f"topic.{name}.remote.storage.enable": "true", f"topic.{name}.segment.bytes": str(32 * 1024),
                       f"topic.{name}.local.retention.ms": "0"}
    properties |= {f"topic.{subject}.{key.replace('_', '.')}": str(value) for key, value in subject_settings.items()}
    return properties


async def _topic_partitions(config: Config, name: str) -> list[TopicIdPartition]:
    async with Cluster.from_config(config) as cluster:
        info = (await cluster.topics([name]))[name]
    return [TopicIdPartition(info.topic_id, name, p) for p in range(PARTITIONS)]


async def _local_log_starts(config: Config, name: str) -> dict[int, int]:
    async with Cluster.from_config(config) as cluster:
        topics = await cluster.topics([name])
        earliest = await cluster.list_offsets(topics, [(name, p) for p in range(PARTITIONS)], OffsetSpec.EARLIEST)
    return {p: earliest[(name, p)].offset for p in range(PARTITIONS)}


async def _segments(config: Config, tps: list[TopicIdPartition]) -> dict[int, list]:
    return {tp.partition: await finished_segments(config, tp) for tp in tps}


def _pass(config: Config, spark) -> PassReport:
    return run_pass(config, spark, summary=False)


async def test_copy_disable_then_a_refused_and_an_accepted_remote_storage_disable(
        spark, kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    subject = topic(partitions=PARTITIONS, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
    other = topic(partitions=PARTITIONS, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
    produced = await produce_codecs(bootstrap, subject, PARTITIONS, 1_500)
    produced += await produce_codecs(bootstrap, other, PARTITIONS, 1_000)
    # local.retention.ms=0 trims only behind records stamped before the pass's clock.
    await until_older(produced, 100)

    tiered = parse(_properties(tmp_path, bootstrap, subject, other))
    report = await asyncio.to_thread(_pass, tiered, spark)
    assert report.ok, report.errors
    tps = await _topic_partitions(tiered, subject)
    first = await _segments(tiered, tps)
    assert all(len(segments) >= 3 for segments in first.values()), first
    starts = await _local_log_starts(tiered, subject)
    assert all(starts[p] == first[p][-1].end_offset + 1 for p in range(PARTITIONS))  # trimmed behind the copies

    # 1. Copy disabled. Kafka's rule, with its message: local retention must then be the
    # whole retention (or -2, which says so).
    with pytest.raises(ConfigError, match="When `remote.log.copy.disable` is set to true, the `local.retention.ms` "
                                          "and `retention.ms` must be set to the identical value because there "
                                          "will be no more logs copied to the remote storage."):
        parse(_properties(tmp_path, bootstrap, subject, other, remote_log_copy_disable="true"))
    newest = {p: segments[-1] for p, segments in first.items()}
    copy_disabled = parse(_properties(
        tmp_path, bootstrap, subject, other, remote_log_copy_disable="true", local_retention_ms=-2,
        local_retention_bytes=-2, retention_bytes=min(s.segment_size_in_bytes for s in newest.values())))
    await produce_codecs(bootstrap, subject, PARTITIONS, 500)
    await produce_codecs(bootstrap, other, PARTITIONS, 1_000)
    report = await asyncio.to_thread(_pass, copy_disabled, spark)
    assert report.ok, report.errors
    subject_rows = [p for p in report.partitions if p.plan.topic == subject]
    assert all(p.plan.copy_disabled and p.plan.empty and p.segments == 0 for p in subject_rows)
    assert all(p.segments > 0 for p in report.partitions if p.plan.topic == other)
    # Still expiring by retention.bytes: only the newest segment of each partition is left.
    assert await _segments(copy_disabled, tps) == {p: [newest[p]] for p in range(PARTITIONS)}
    assert await _local_log_starts(copy_disabled, subject) == starts  # nothing trimmed past what is remote

    # ... and still served: from offset 0 a consumer is reset to the remote log start and
    # reads the remote segment, then the broker's data.
    proxy = ProxyThread(proxy_config(bootstrap, nodes=1, **{
        "remote.log.storage.local.dir": tmp_path / "remote", "remote.log.metadata.dir": tmp_path / "metadata"})).start()
    try:
        remote_start = {p: newest[p].start_offset for p in range(PARTITIONS)}
        consumed = await asyncio.to_thread(
            consume_confluent_assigned, {"bootstrap.servers": proxy.bootstrap_servers}, subject, range(PARTITIONS),
            sum(_log_end(kafka_cluster, subject, p) - remote_start[p] for p in range(PARTITIONS)))
        by_partition = {p: [offset for partition, offset, _, _ in consumed if partition == p] for p in range(PARTITIONS)}
        for p in range(PARTITIONS):
            assert by_partition[p][0] == remote_start[p] < starts[p], (p, by_partition[p][:3], starts[p])
            assert by_partition[p] == list(range(remote_start[p], _log_end(kafka_cluster, subject, p)))

        # 2. Remote storage turned off without deleting: refused with Kafka's message, by
        # the command (exit status 1), nothing deleted; the other topic is copied as usual.
        refused = _properties(tmp_path, bootstrap, subject, other, remote_storage_enable="false")
        await produce_codecs(bootstrap, other, PARTITIONS, 1_000)
        done = await asyncio.to_thread(_tier_command, refused, tmp_path / "refused.properties")
        assert done.returncode == 1, done.stderr[-3000:]
        assert "Traceback" not in done.stderr
        message = f"topic.{subject}.remote.storage.enable=false: {DISABLE_WITHOUT_DELETE}"
        (summary,) = [json.loads(line) for line in done.stdout.splitlines()]
        assert summary["errors"] == [message]
        assert message in done.stderr
        assert await _segments(copy_disabled, tps) == {p: [newest[p]] for p in range(PARTITIONS)}
        other_rows = [row for row in summary["partitions"] if row["topic"] == other]
        assert len(other_rows) == PARTITIONS
        assert all(row["error"] is None and row["segments"] > 0 for row in other_rows), other_rows

        # 3. Turned off with remote.log.delete.on.disable: its remote data and metadata go.
        deleting = parse(_properties(tmp_path, bootstrap, subject, other, remote_storage_enable="false",
                                     remote_log_delete_on_disable="true"))
        report = await asyncio.to_thread(_pass, deleting, spark)
        assert report.ok, report.errors
        assert [r.topic_id_partition for r in report.disabled.removed] == tps
        async with metadata_manager(deleting) as rlmm, remote_storage_manager(deleting) as rsm:
            for tp in tps:
                assert rlmm.list_segments(tp) == []
                assert rlmm.partition_delete_state(tp) == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED
                assert await rsm.list_partition_objects(tp) == []
            other_tps = await _topic_partitions(deleting, other)
            assert all(any(s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED for s in rlmm.list_segments(tp))
                       for tp in other_tps)
        # The next pass has nothing more to delete, and refuses nothing.
        report = await asyncio.to_thread(_pass, deleting, spark)
        assert report.ok and report.disabled.removed == [], report.errors

        # Nothing of it is served any more: offset 0 is out of range, the consumer is reset
        # to the broker's own log start.
        local = {p: _log_end(kafka_cluster, subject, p) - starts[p] for p in range(PARTITIONS)}
        await wait_until(lambda: not _serves_remote(proxy, subject, starts), 30, "the proxy saw the delete")
        consumed = await asyncio.to_thread(
            consume_confluent_assigned, {"bootstrap.servers": proxy.bootstrap_servers}, subject, range(PARTITIONS),
            sum(local.values()))
        for p in range(PARTITIONS):
            offsets = [offset for partition, offset, _, _ in consumed if partition == p]
            assert offsets == list(range(starts[p], starts[p] + local[p]))
    finally:
        proxy.stop()


def _log_end(kafka_cluster, name: str, partition: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": "watermarks"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=30)[1]
    finally:
        consumer.close()


def _serves_remote(proxy: ProxyThread, name: str, starts: dict[int, int]) -> bool:
    """Whether ListOffsets EARLIEST through the proxy still answers below the broker's log start."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": proxy.bootstrap_servers, "group.id": "watermarks"})
    try:
        return any(consumer.get_watermark_offsets(TopicPartition(name, p), timeout=30)[0] < starts[p]
                   for p in range(PARTITIONS))
    finally:
        consumer.close()


def _tier_command(properties: dict[str, str], path: Path) -> subprocess.CompletedProcess:
    write_properties(path, properties)
    return subprocess.run([str(TIERPROXY), "tier", "--config", str(path), "--json"], env=SPARK_ENV,
                          capture_output=True, text=True, timeout=240)
