"""A tiering pass publishes the remote log metadata into the remote store: a proxy's
`remote.log.metadata.backend=remote`, built from the store alone, sees exactly what the
pipeline's metadata store holds, follows a further pass, and never sees a publication that
failed after the commits (the next pass publishes it)."""

from __future__ import annotations

import asyncio

import pytest

from tierproxy.pipeline.copy import metadata_manager
from tierproxy.config import parse
from tierproxy.pipeline.tier import run_pass
from tierproxy.storage.errors import RemoteStorageError
from tierproxy.storage.factory import remote_log_metadata_manager
from tierproxy.storage.metadata.bucket import FOLDER, HEAD
from tierproxy.storage.rsm import ObjectStoreRemoteStorageManager
from tests.helpers.pipeline import BROKER_SEGMENT_BYTES, assert_clean, tier_config
from tests.helpers.produce import produce_codecs


def remote_view(rlmm, tps):
    """Every segment (states, leader epochs, offsets), log start and end, delete state."""
    return {tp: (rlmm.list_segments(tp), rlmm.log_start_offset(tp), rlmm.log_end_offset(tp),
                 rlmm.partition_delete_state(tp)) for tp in tps}


async def primary_view(config):
    async with metadata_manager(config) as rlmm:
        tps = rlmm.partitions()
        return tps, remote_view(rlmm, tps)


@pytest.mark.parametrize("store", ["local", "s3"])
async def test_a_pass_publishes_what_it_committed_for_a_reader_with_only_the_store(
        spark, kafka_cluster, topic, tmp_path, store, request, monkeypatch):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=2, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
    await produce_codecs(bootstrap, name, 2, 2_000)
    s3 = request.getfixturevalue("s3_server") if store == "s3" else None
    config = tier_config(tmp_path, bootstrap, name, s3=s3, key_prefix=f"publish-{name}")
    assert_clean(await asyncio.to_thread(run_pass, config, spark))
    tps, first = await primary_view(config)
    assert len(tps) == 2 and all(view[0] for view in first.values())

    # A proxy with the store's settings only: no metadata directory, no cluster.
    replica = {**config.values, "remote.log.metadata.backend": "remote",
               "remote.log.metadata.dir": tmp_path / "nothing-here", "bootstrap.servers": ()}
    async with remote_log_metadata_manager(replica, read_only=True) as rlmm:
        assert remote_view(rlmm, tps) == first

        # The next pass commits, then fails to replace the head: nothing of it is read.
        await produce_codecs(bootstrap, name, 2, 2_000)
        put_object = ObjectStoreRemoteStorageManager.put_object

        async def head_fails(self, key, data):
            if key.endswith(f"{FOLDER}/{HEAD}"):
                raise RemoteStorageError("the store went away", retriable=True)
            await put_object(self, key, data)

        monkeypatch.setattr(ObjectStoreRemoteStorageManager, "put_object", head_fails)
        report = await asyncio.to_thread(run_pass, config, spark)
        monkeypatch.undo()
        assert not report.ok and report.publish_error and "the store went away" in report.publish_error
        _, second = await primary_view(config)
        assert second != first and all(s[0] != f[0] for s, f in zip(second.values(), first.values()))
        await rlmm.refresh()
        assert remote_view(rlmm, tps) == first  # never ahead: what the store committed is not there yet

        # A pass with nothing new to copy publishes what the failed one could not.
        assert_clean(await asyncio.to_thread(run_pass, config, spark))
        _, third = await primary_view(config)
        assert await rlmm.refresh() >= 2
        assert remote_view(rlmm, tps) == third
        assert rlmm.published_ms is not None


def test_the_pipeline_refuses_the_read_only_remote_backend(tmp_path):
    config = parse({"bootstrap.servers": "127.0.0.1:1", "remote.log.metadata.backend": "remote",
                    "remote.log.metadata.dir": str(tmp_path / "metadata"), "remote.log.storage.backend": "local",
                    "remote.log.storage.local.dir": str(tmp_path / "remote")})
    report = run_pass(config, None, summary=False)
    assert report.error and "remote.log.metadata.backend=remote is read-only" in report.error
    assert not (tmp_path / "remote").exists()
