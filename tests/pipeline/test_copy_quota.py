"""KIP-956's copy quota over a whole tiering pass: the Spark tasks running at once share
`remote.log.manager.copy.max.bytes.per.second`, so copying N bytes takes about N / quota
seconds, however many partitions copy them. The same copy without the quota takes far
less (a third on a slow disk), so the tolerance below cannot be met without it. Ratios
only: the machine may be slow, never faster than the quota allows."""

from __future__ import annotations

import asyncio
import os

from confluent_kafka import Producer

from tierproxy.pipeline.tier import run_pass
from tests.helpers.pipeline import BROKER_SEGMENT_BYTES, check_remote_log, tier_config

PARTITIONS = 2
RECORD_BYTES = 1000
MB_PER_PARTITION = 3
QUOTA_BYTES_PER_SECOND = 400_000
SEGMENT_BYTES = 512 * 1024


def _produce_incompressible(bootstrap: str, topic: str) -> None:
    # Batches smaller than the broker's segments (BROKER_SEGMENT_BYTES), or it refuses them.
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "none", "linger.ms": 5,
                         "batch.size": 32 * 1024})
    errors = []
    for partition in range(PARTITIONS):
        for _ in range(MB_PER_PARTITION * 1_000_000 // RECORD_BYTES):
            producer.produce(topic, os.urandom(RECORD_BYTES), partition=partition,
                             on_delivery=lambda error, _: error is not None and errors.append(error))
            producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors[:3]


async def test_a_pass_copies_at_the_quota_shared_by_its_tasks(spark, kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    reports = {}
    for quota in (QUOTA_BYTES_PER_SECOND, None):
        name = topic(partitions=PARTITIONS, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
        await asyncio.to_thread(_produce_incompressible, bootstrap, name)
        extra = {} if quota is None else {"remote.log.manager.copy.max.bytes.per.second": quota}
        config = tier_config(tmp_path / name, bootstrap, name, topic_settings={"segment.bytes": SEGMENT_BYTES},
                             extra=extra)
        report = await asyncio.to_thread(run_pass, config, spark, retention=False, summary=False)
        assert report.ok, report.errors
        await check_remote_log(config, name, tail_may_wait=True)  # byte-identical, contiguous
        reports[quota] = report

    throttled = reports[QUOTA_BYTES_PER_SECOND]
    assert throttled.bytes >= PARTITIONS * (MB_PER_PARTITION * 1_000_000 - SEGMENT_BYTES)
    # Each of the 2 tasks running at once (local[2]) got half the quota; its first segment
    # went at once, each next one when the task's rate allowed it: N / Q less a segment per
    # task, plus Spark's own time for the job (a few seconds more on a loaded machine).
    expected = throttled.bytes / QUOTA_BYTES_PER_SECOND
    assert 0.7 <= throttled.copy_seconds / expected <= 2.5, (throttled.copy_seconds, expected)
    assert all(p.throttle_waits for p in throttled.partitions)
    assert all(w > 0 for p in throttled.partitions for w in p.throttle_waits)

    unthrottled = reports[None]
    assert abs(unthrottled.bytes - throttled.bytes) < 0.1 * throttled.bytes
    assert unthrottled.copy_seconds < 0.7 * expected, (unthrottled.copy_seconds, expected)
    assert not any(p.throttle_waits for p in unthrottled.partitions)
