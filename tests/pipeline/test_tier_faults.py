"""`tierproxy tier` when the object store fails during orphan cleanup: one line per
failure, the summary still printed (on stdout, or as JSON), exit status 1, no traceback,
and nothing trimmed from the broker that is not safe remotely.

Orphans are COPY_SEGMENT_STARTED segments left by an earlier pass that stopped half-way
(a full disk, a killed executor); the next pass deletes them first. Here that delete
fails: a local store whose partition directory is a file (every unlink in it fails with
ENOTDIR, as a read-only store fails with EROFS), and an S3 endpoint nobody listens on.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

from testbed.ports import free_port
from tierproxy.client.cluster import Cluster
from tierproxy.config import parse
from tierproxy.pipeline.copy import metadata_manager
from tierproxy.protocol.apis import OffsetSpec
from tierproxy.storage.model import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition
from tierproxy.storage.rsm import partition_key_prefix
from tests.helpers.commands import SPARK_ENV, TIERPROXY, write_properties
from tests.helpers.produce import produce_codecs
PARTITIONS = 2


async def _add_orphans(properties: dict[str, str], topic: str) -> list[TopicIdPartition]:
    """One COPY_SEGMENT_STARTED segment per partition, as a pass that died mid-copy leaves."""
    config = parse(properties)
    async with Cluster.from_config(config) as cluster:
        info = (await cluster.topics([topic]))[topic]
    tps = [TopicIdPartition(info.topic_id, topic, p) for p in range(PARTITIONS)]
    async with metadata_manager(config) as rlmm:
        for tp in tps:
            await rlmm.add_remote_log_segment_metadata(RemoteLogSegmentMetadata(
                RemoteLogSegmentId.generate(tp), 0, 9, int(time.time() * 1000), 0, int(time.time() * 1000),
                ((0, 0),), 1000))
    return tps


def _tier(properties: dict[str, str], path: Path, *extra: str) -> subprocess.CompletedProcess:
    write_properties(path, properties)
    return subprocess.run([str(TIERPROXY), "tier", "--config", str(path), *extra], env=SPARK_ENV,
                          capture_output=True, text=True, timeout=240)


def _assert_one_line_failure(done: subprocess.CompletedProcess, topic: str, cause: str) -> None:
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    for p in range(PARTITIONS):
        # The summary table, on stdout, with the partition's error on its row and below it.
        (row,) = [line for line in done.stdout.splitlines() if line.startswith(f"{topic}-{p} ")]
        assert "ERROR orphan cleanup failed" in row and cause in row, done.stdout
        assert f"ERROR {topic}-{p}: orphan cleanup failed: RemoteStorageError" in done.stdout
        # One log line on stderr per failed partition.
        logged = [line for line in done.stderr.splitlines() if f"{topic}-{p}: orphan cleanup failed" in line]
        assert len(logged) == 1, done.stderr[-3000:]
    assert f"{PARTITIONS} partitions, 0 segments" in done.stdout


async def _log_start_offsets(bootstrap: str, topic: str) -> list[int]:
    async with Cluster([bootstrap]) as cluster:
        topics = await cluster.topics([topic])
        earliest = await cluster.list_offsets(topics, [(topic, p) for p in range(PARTITIONS)], OffsetSpec.EARLIEST)
    return [earliest[(topic, p)].offset for p in range(PARTITIONS)]


async def test_a_local_store_failing_during_orphan_cleanup_is_one_line(kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=PARTITIONS)
    await produce_codecs(bootstrap, name, PARTITIONS, 200)
    root = tmp_path / "remote"
    properties = {
        "bootstrap.servers": bootstrap, "remote.log.storage.local.dir": str(root),
        "remote.log.metadata.dir": str(tmp_path / "metadata"), "spark.master": "local[2]", "metrics.port": "0",
        f"topic.{name}.remote.storage.enable": "true", f"topic.{name}.local.retention.ms": "0",
    }
    tps = await _add_orphans(properties, name)
    # Each partition's directory is a file: every delete in it fails (ENOTDIR).
    for tp in tps:
        path = root.joinpath(*partition_key_prefix("", tp).rstrip("/").split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not a directory")

    done = _tier(properties, tmp_path / "tier.properties")
    _assert_one_line_failure(done, name, "Not a directory")
    assert await _log_start_offsets(bootstrap, name) == [0] * PARTITIONS

    # The orphans are DELETE_SEGMENT_STARTED now (never served): the next pass leaves them to
    # remote retention, whose deletes fail the same way, one line each, here as JSON.
    done = _tier(properties, tmp_path / "tier.properties", "--json")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    (document,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert document["ok"] is False and document["segments"] == 0
    assert [(p["topic"], p["partition"]) for p in document["partitions"]] == [(name, p) for p in range(PARTITIONS)]
    assert sorted(e.split(": RemoteStorageError: ")[0] for e in document["errors"]) == [
        f"remote retention {tp}" for tp in tps]
    assert all("Not a directory" in e for e in document["errors"])
    assert await _log_start_offsets(bootstrap, name) == [0] * PARTITIONS


async def test_an_unreachable_s3_endpoint_during_orphan_cleanup_is_one_line(kafka_cluster, topic, s3_server, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=PARTITIONS)
    await produce_codecs(bootstrap, name, PARTITIONS, 200)
    properties = {
        "bootstrap.servers": bootstrap, **s3_server.storage_properties(f"faults-{name}"),
        "remote.log.metadata.dir": str(tmp_path / "metadata"), "spark.master": "local[2]", "metrics.port": "0",
        f"topic.{name}.remote.storage.enable": "true", f"topic.{name}.local.retention.ms": "0",
    }
    tps = await _add_orphans(properties, name)
    unreachable = {**properties, "remote.log.storage.s3.endpoint.url": f"http://127.0.0.1:{free_port()}",
                   "remote.log.storage.s3.max.attempts": "2", "remote.log.manager.task.retry.backoff.ms": "10"}
    done = _tier(unreachable, tmp_path / "tier.properties")
    _assert_one_line_failure(done, name, "Could not connect to the endpoint URL")
    assert await _log_start_offsets(bootstrap, name) == [0] * PARTITIONS

    # With the store back, the next pass finishes the deletes the failed one began.
    done = _tier(properties, tmp_path / "tier.properties", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    (document,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert document["ok"] and document["errors"] == []
    async with metadata_manager(parse(properties)) as rlmm:
        assert all(rlmm.list_segments(tp) == [] for tp in tps)



async def test_with_the_store_down_each_pass_names_the_failed_upload_first(spark, kafka_cluster, topic, s3_server,
                                                                          tmp_path):
    from tierproxy.pipeline.tier import run_pass
    from tests.helpers.pipeline import tier_config

    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=1)
    await produce_codecs(bootstrap, name, 1, 50)
    # segment.ms=1: the data is due for upload; the store's endpoint has nobody listening.
    config = tier_config(tmp_path, bootstrap, name, s3=s3_server, key_prefix=f"down-{name}",
                         topic_settings={"segment.ms": 1},
                         extra={"remote.log.storage.s3.endpoint.url": f"http://127.0.0.1:{free_port()}",
                                "remote.log.storage.s3.max.attempts": "1"})
    # The second pass finds the first one's failed attempts as orphans; its error still
    # begins with the upload, the orphan cleanup after it.
    for _ in range(2):
        report = await asyncio.to_thread(run_pass, config, spark)
        (summary,) = report.partitions
        assert summary.error.startswith("copy failed: RemoteStorageError: upload of the segment at offset 0 "), \
            summary.error
        assert "Could not connect to the endpoint URL" in summary.error
        assert summary.error.index("orphan cleanup failed") > summary.error.index("upload of the segment")
        assert summary.segments == 0
