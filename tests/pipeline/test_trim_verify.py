"""Local retention checks the remote segments it would leave only remote, where they are
stored, before it trims the broker: a deleted `.log` and a flipped byte each stop the trim
of their partition (the broker keeps its log start), the other partitions trim, the failure
is counted, in the pass summary, a dry run before the pass says the same, and `tierproxy
status` names it; with the local-file store
and with S3 (moto's server)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tierproxy.client.cluster import Cluster
from tierproxy.config import parse
from tierproxy.pipeline.metrics import PipelineMetrics
from tierproxy.pipeline.retention import run_retention
from tierproxy.pipeline.dry_run import dry_pass
from tierproxy.pipeline.plan import plan_pass
from tierproxy.pipeline.tier import PartitionSummary, PassReport, format_summary
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.rsm import ObjectType, RemoteStorageManager, segment_object_key
from tests.helpers.commands import write_properties
from tests.helpers.retention import broker_log_start, produce_groups, stores, tier

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
SEGMENT_OFFSETS = 20  # one produced group per segment: [0, 19], [20, 39], ...


async def _delete(rsm: RemoteStorageManager, server, key: str) -> None:
    if isinstance(rsm, LocalRemoteStorageManager):
        rsm.path_of(key).unlink()
    else:
        await asyncio.to_thread(server.client().delete_object, Bucket=server.bucket, Key=key)


async def _flip(rsm: RemoteStorageManager, server, key: str, position: int) -> None:
    """One byte of the stored object changed, its size kept (S3: rewritten by another tool,
    which records no CRC-32C of it)."""
    if isinstance(rsm, LocalRemoteStorageManager):
        with open(rsm.path_of(key), "r+b") as f:
            f.seek(position)
            byte = f.read(1)[0]
            f.seek(position)
            f.write(bytes([byte ^ 0x01]))
        return
    client = server.client()
    data = bytearray(client.get_object(Bucket=server.bucket, Key=key)["Body"].read())
    data[position] ^= 0x01
    await asyncio.to_thread(client.put_object, Bucket=server.bucket, Key=key, Body=bytes(data))


async def _dry_run(config, cluster: Cluster, rlmm, rsm: RemoteStorageManager) -> PassReport:
    """The report of `tier --dry-run` (`tier._pass`), over the stores this test holds open."""
    plans = await plan_pass(config, cluster, rlmm)
    report = PassReport(partitions=[PartitionSummary(p) for p in plans], dry_run=True)
    await dry_pass(config, cluster, rlmm, rsm, report, plans, retention=True)
    return report


def _status(properties: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tierproxy.cli", "status", "--config", str(properties), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("backend", ["local", "s3"])
async def test_a_deleted_and_a_corrupted_object_stop_the_trim_of_their_partitions(
        backend, kafka_cluster, topic, tmp_path, request):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=PARTITIONS)
    server = request.getfixturevalue("s3_server") if backend == "s3" else None
    properties = {
        "bootstrap.servers": bootstrap,
        "remote.log.storage.local.dir": str(tmp_path / "remote"),
        "remote.log.metadata.dir": str(tmp_path / "metadata"),
        f"topic.{name}.remote.storage.enable": "true",
        **(server.storage_properties(f"verify-{name}") if server else {}),
    }
    for p in range(PARTITIONS):
        await produce_groups(bootstrap, name, partition=p)
    async with stores(parse(properties)) as (rlmm, rsm), Cluster(bootstrap.split(",")) as cluster:
        segments = {p: await tier(bootstrap, rlmm, rsm, tmp_path / "work", name, end=80, partition=p)
                    for p in range(PARTITIONS)}
        assert [(s.start_offset, s.end_offset) for s in segments[0]] == [(0, 19), (20, 39), (40, 59), (60, 79)]

        # Pass 1: the first segment of each partition is past local.retention.ms.
        retention_ms = 3_600_000
        first = parse({**properties, f"topic.{name}.local.retention.ms": str(retention_ms)})
        newest_first = max(segments[p][0].max_timestamp_ms for p in range(PARTITIONS))  # a minute before the next
        report = await run_retention(first, cluster, rlmm, rsm, now_ms=newest_first + retention_ms + 1)
        assert report.ok, report.failures
        assert [await broker_log_start(cluster, name, p) for p in range(PARTITIONS)] == [20] * PARTITIONS

        # Then the `.log` of partition 0's second segment goes, and a byte of partition 1's third changes.
        deleted = segment_object_key(rsm.prefix, segments[0][1], ObjectType.LOG)
        flipped = segment_object_key(rsm.prefix, segments[1][2], ObjectType.LOG)
        await _delete(rsm, server, deleted)
        await _flip(rsm, server, flipped, 100)

        # Pass 2: everything remote is past local retention. A dry run first checks the
        # same segments, and says the same: two trims stopped, a failed pass.
        second = parse({**properties, f"topic.{name}.local.retention.ms": "0"})
        dry = await _dry_run(second, cluster, rlmm, rsm)
        assert not dry.ok
        assert [t.topic_id_partition.partition for t in dry.retention.trimmed] == [2]
        assert sorted((d.segment.topic_id_partition.partition, d.key, d.reason) for d in dry.retention.damaged) == [
            (0, deleted, "missing"), (1, flipped, "checksum")]
        said = format_summary(dry)
        assert f"ERROR local retention {name}-0: trim would stop: " in said and deleted in said
        assert f"ERROR local retention {name}-1: trim would stop: " in said and flipped in said
        assert "1 partitions trimmed" in said
        assert [await broker_log_start(cluster, name, p) for p in range(PARTITIONS)] == [20] * PARTITIONS
        report = await run_retention(second, cluster, rlmm, rsm, now_ms=int(time.time() * 1000) + retention_ms)
        starts = [await broker_log_start(cluster, name, p) for p in range(PARTITIONS)]
        assert starts == [20, 20, 80]  # below the damaged segments (20 and 40); the intact partition trims
        assert [(t.topic_id_partition.partition, t.new_log_start_offset) for t in report.trimmed] == [(2, 80)]
        assert sorted((d.segment.topic_id_partition.partition, d.key, d.reason) for d in report.damaged) == [
            (0, deleted, "missing"), (1, flipped, "checksum")]
        failed = {f.partition: f.error for f in report.failures}
        assert set(failed) == {f"{name}-0", f"{name}-1"}
        assert deleted in failed[f"{name}-0"] and "missing" in failed[f"{name}-0"]
        assert flipped in failed[f"{name}-1"] and "CRC-32C" in failed[f"{name}-1"]

        # Counted, and in the pass summary as a failure of each partition.
        metrics = PipelineMetrics()
        metrics.record(PassReport(retention=report))
        count = metrics.registry.get_sample_value
        assert count("tierproxy_remote_segment_verify_failures_total", {"topic": name, "reason": "missing"}) == 1
        assert count("tierproxy_remote_segment_verify_failures_total", {"topic": name, "reason": "checksum"}) == 1
        summary = format_summary(PassReport(retention=report))
        assert f"ERROR local retention {name}-0: trim stopped: " in summary and deleted in summary
        assert f"ERROR local retention {name}-1: trim stopped: " in summary and flipped in summary

        # A pass that finds the damage still there leaves the broker alone again.
        report = await run_retention(second, cluster, rlmm, rsm, now_ms=int(time.time() * 1000) + retention_ms)
        assert len(report.damaged) == 2 and report.trimmed == []
        assert [await broker_log_start(cluster, name, p) for p in range(PARTITIONS)] == [20, 20, 80]

    # `status` names the missing object (sizes); `status --verify` both (CRC-32C too).
    path = write_properties(tmp_path / "tierproxy.properties", properties)
    plain = _status(path)
    assert plain.returncode == 1, plain.stderr
    assert deleted in plain.stderr and flipped not in plain.stderr
    verified = _status(path, "--verify")
    assert verified.returncode == 1, verified.stderr
    assert f"{name}-0: segment {segments[0][1].segment_id.id} (offsets 20-39) cannot be read" in verified.stderr
    assert deleted in verified.stderr and flipped in verified.stderr
    assert f"{name}-2:" not in verified.stderr
