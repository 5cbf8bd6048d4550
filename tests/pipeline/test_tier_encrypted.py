"""`tierproxy tier` with encryption turned on, then rotated, against the real broker and
Spark in local mode: segments copied before encryption, under k1 and under k2 sit side by side
in each partition, and one replay through the proxy and one Spark read each return every
record; with k1 retired too early they refuse rather than serve. To S3 the same, with
server-side encryption on every object too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tierproxy.client.cluster import Cluster
from tierproxy.pipeline.datasource import register
from tierproxy.pipeline.tier import run_pass
from tierproxy.storage.factory import remote_storage_manager
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.rsm import ObjectType, RemoteStorageManager, segment_object_key
from tests.helpers.consume import consume_aiokafka
from tests.helpers.datasource import read, rows_of
from tests.helpers.pipeline import assert_clean, check_remote_log, tier_config
from tests.helpers.produce import produce_timed
from tests.helpers.proxy import running_proxy
from tests.helpers.tiered import encryption_keys, local_store, write_key

PARTITIONS = 2
PER_PHASE = 400  # records per partition and phase, 1 KB each: several 128 KiB segments
pytestmark = pytest.mark.timeout(600)


def _keys(directory: Path, *ids: str) -> dict[str, Path]:
    return {key_id: write_key(directory / f"{key_id}.key") for key_id in ids}


def _encryption(keys: dict[str, Path], active: str) -> dict[str, str]:
    return {"remote.log.storage.encryption.keys": encryption_keys(keys),
            "remote.log.storage.encryption.active.key": active}


async def _key_ids(rsm: RemoteStorageManager, segments) -> list[str | None]:
    return [m.encryption.key_id if m.encryption else None for m in
            [await rsm.fetch_manifest(s) for s in segments]]


async def test_rotation_through_the_pipeline_then_one_replay_through_the_proxy_and_spark(
        spark, kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=PARTITIONS, config={"internal.segment.bytes": 64 * 1024})
    keys = _keys(tmp_path / "keys", "k1", "k2")
    phases = [{}, _encryption({"k1": keys["k1"]}, "k1"), _encryption(keys, "k2")]
    produced = []
    for extra in phases:
        produced += await asyncio.to_thread(produce_timed, kafka_cluster.client_config(), name, PARTITIONS,
                                            PER_PHASE, value_size=1000)
        config = tier_config(tmp_path, bootstrap, name, extra=extra)
        report = await asyncio.to_thread(run_pass, config, spark)
        assert_clean(report)
        assert report.segments > 0
    # Every remote .log, decrypted, is what the broker serves at the same offsets.
    segments = await check_remote_log(config, name, tail_may_wait=True)

    local = LocalRemoteStorageManager(tmp_path / "remote")
    async with remote_storage_manager(config) as rsm:
        for partition, tiered in segments.items():
            key_ids = await _key_ids(rsm, tiered)
            # In copy order: plaintext, then k1, then k2; each phase copied at least one segment.
            assert [k for i, k in enumerate(key_ids) if i == 0 or key_ids[i - 1] != k] == [None, "k1", "k2"], key_ids
            for segment, key_id in zip(tiered, key_ids):
                stored = local.path_of(segment_object_key("", segment, ObjectType.LOG)).read_bytes()
                value = next(r.value for r in produced
                             if r.partition == partition and segment.start_offset <= r.offset <= segment.end_offset)
                assert (value in stored) == (key_id is None), (segment.start_offset, key_id)

    # Trim the broker to the remote end: everything below comes from the remote tier.
    ends = {p: s[-1].end_offset + 1 for p, s in segments.items()}
    async with Cluster([bootstrap]) as cluster:
        topics = await cluster.topics([name])
        await cluster.delete_records(topics, {(name, p): end for p, end in ends.items()})
    expected = sorted((r.partition, r.offset, r.key, r.value) for r in produced)
    remote = [row for row in expected if row[1] < ends[row[0]]]

    with running_proxy(bootstrap, nodes=1, **local_store(tmp_path), **phases[2]) as proxy:
        consumed = await consume_aiokafka(proxy.bootstrap_servers, name, len(produced))
        assert sorted((r.partition, r.offset, r.key, r.value) for r in consumed) == expected
        assert proxy.metrics.value("tierproxy_remote_partitions_served_total", {"topic": name}) >= PARTITIONS

    register(spark)
    options = {"topic": name, **local_store(tmp_path), **phases[2]}
    rows = await asyncio.to_thread(lambda: rows_of(read(spark, options), name))
    assert [row[:4] for row in rows] == remote

    # k1 retired while segments still use it: refused, never served as other bytes.
    retired = {**options, **_encryption({"k2": keys["k2"]}, "k2")}
    with pytest.raises(Exception, match="encrypted with key 'k1'"):
        await asyncio.to_thread(lambda: read(spark, retired).count())


async def test_tier_to_s3_with_envelope_and_server_side_encryption(spark, kafka_cluster, topic, s3_server, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=1, config={"internal.segment.bytes": 64 * 1024})
    await asyncio.to_thread(produce_timed, kafka_cluster.client_config(), name, 1, PER_PHASE, value_size=1000)
    prefix = f"sse-{name}"
    config = tier_config(tmp_path, bootstrap, name, s3=s3_server, key_prefix=prefix, extra={
        **_encryption(_keys(tmp_path / "keys", "k1"), "k1"),
        "remote.log.storage.s3.sse": "aws:kms", "remote.log.storage.s3.sse.kms.key.id": "alias/tierproxy"})
    assert_clean(await asyncio.to_thread(run_pass, config, spark))
    (segments,) = (await check_remote_log(config, name, tail_may_wait=True)).values()
    client = s3_server.client()
    async with remote_storage_manager(config) as rsm:
        assert set(await _key_ids(rsm, segments)) == {"k1"}
        keys = await rsm.list_partition_objects(segments[0].topic_id_partition)
    assert len(keys) >= len(segments) * (len(ObjectType) - 1)
    for key in keys:
        head = client.head_object(Bucket=s3_server.bucket, Key=key)
        assert head["ServerSideEncryption"] == "aws:kms" and head["SSEKMSKeyId"].endswith("alias/tierproxy"), key
