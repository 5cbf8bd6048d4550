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
