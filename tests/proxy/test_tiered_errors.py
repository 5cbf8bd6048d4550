"""RemoteTier.error_code_for: a failed remote read answered under Kafka's codes, counted by
its cause (remote_log/failures.py), every one; logged once per partition and kind of error
per interval, with how many were left out."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry

from tierproxy.config import parse
from tierproxy.protocol.apis import ErrorCode
from tierproxy.proxy.tiered import RemoteTier
from tierproxy.remote_log.reader_pool import ReaderQueueFull
from tierproxy.storage.errors import EncryptionKeyNotFound, MetadataNotReady, RemoteStorageError
from tests.helpers.remote_log import local_remote_log, new_tp


async def test_failures_are_counted_by_cause_and_logged_once_per_interval(tmp_path, caplog):
    config = parse({"bootstrap.servers": "127.0.0.1:9092"})
    tp, other = new_tp(), new_tp("clicks")
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        tier = RemoteTier(config, rsm=rsm, rlmm=rlmm, registry=CollectorRegistry())
        value = tier.metrics.value
        with caplog.at_level(logging.WARNING, logger="tierproxy.tiered"):
            for _ in range(1_000):
                assert tier.error_code_for(tp, EncryptionKeyNotFound("key k1 is not configured"), "FETCH") \
                    == tier.unavailable_code
            tier.error_code_for(tp, ReaderQueueFull("1 remote log reader busy"), "FETCH")
            tier.error_code_for(other, RemoteStorageError("read timeout", retriable=True), "LIST_OFFSETS")
            assert tier.error_code_for(tp, MetadataNotReady("loading"), "FETCH") == ErrorCode.replica_not_available
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 4, lines
        assert "key_not_found" in lines[0] and "queue_full" in lines[1] and "store_unavailable" in lines[2]
        assert "not ready" in lines[3]

        def not_available(topic: str, cause: str) -> float:
            return value("tierproxy_tiered_storage_not_available_total", {"topic": topic, "cause": cause})

        assert not_available(tp.topic, "key_not_found") == 1_000
        assert not_available(tp.topic, "queue_full") == 1
        assert not_available(other.topic, "store_unavailable") == 1
        assert value("tierproxy_remote_read_errors_total", {"topic": tp.topic, "reason": "metadata_not_ready"}) == 1
        assert not_available(tp.topic, "metadata_not_ready") == 0  # answered REPLICA_NOT_AVAILABLE
        await tier.engine.close()


async def test_a_lasting_metadata_refresh_failure_is_logged_once_until_it_changes(tmp_path, caplog, monkeypatch):
    """The file and topic backends are refreshed every second: a damaged metadata file
    must not write a traceback every second, only when the failure starts or changes."""
    import asyncio
    from tierproxy.proxy import tiered

    config = parse({"bootstrap.servers": "127.0.0.1:9092"})
    monkeypatch.setattr(tiered, "METADATA_REFRESH_S", 0.01)
    failures = [ValueError("bad record at 7")] * 20 + [ValueError("bad record at 9")] * 20 + [None] * 5
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        async def refresh() -> None:
            failure = failures.pop(0) if failures else None
            if failure is not None:
                raise failure

        monkeypatch.setattr(rlmm, "refresh", refresh)
        tier = RemoteTier(config, rsm=rsm, rlmm=rlmm, registry=CollectorRegistry())
        with caplog.at_level(logging.INFO, logger="tierproxy.tiered"):
            task = asyncio.get_running_loop().create_task(tier._refresh_metadata())
            while failures:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            task.cancel()
        lines = [r.getMessage() for r in caplog.records if "refresh" in r.getMessage()]
        assert len(lines) == 3, lines
        assert "failed" in lines[0] and "failed" in lines[1] and "refreshed again" in lines[2]
        await tier.engine.close()
