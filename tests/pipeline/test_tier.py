"""A tiering pass against the real broker, with Spark in local mode: every remote `.log` is what a
broker Fetch returns at the same offsets, and the FINISHED segments cover each partition
contiguously from offset 0 to below its last stable offset."""

from __future__ import annotations

import asyncio
import re

from aiokafka import AIOKafkaProducer

from tierproxy.pipeline.tier import format_summary, run_pass, summary_json
from tierproxy.client.cluster import Cluster
from tierproxy.config import parse
from tierproxy.protocol.apis import OffsetSpec
from tierproxy.storage.model import RemoteLogSegmentState
from tests.helpers.pipeline import (
    BROKER_SEGMENT_BYTES,
    SEGMENT_BYTES,
    aborted_transactions,
    all_segments,
    assert_clean,
    check_remote_log,
    tier_config,
)
from tests.helpers.produce import produce_codecs, produce_mixed, until_older

S = RemoteLogSegmentState


async def test_tier_copies_byte_identical_contiguous_segments_and_then_only_new_data(
        spark, kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=3, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
    produced = await produce_mixed(bootstrap, name, 3, per_codec=10_000, per_transaction=500)
    assert len(produced) >= 50_000
    config = tier_config(tmp_path, bootstrap, name)

    report = await asyncio.to_thread(run_pass, config, spark)
    assert_clean(report)
    assert [p.name for p in report.partitions] == [f"{name}-{p}" for p in range(3)]
    first = await check_remote_log(config, name, tail_may_wait=True)
    for p, segments in first.items():
        assert len(segments) >= 3, f"partition {p}: {len(segments)} segments"
        summary = report.partitions[p]
        assert summary.segments == len(segments)
        assert summary.bytes == sum(m.segment_size_in_bytes for m in segments)
        # What was committed, not the plan (whose tail waits for its segment to fill).
        copied = [segments[0].start_offset, segments[-1].end_offset + 1]
        assert copied[1] < summary.plan.end_offset
        assert summary_json(report)["partitions"][p]["copied_range"] == copied
        assert re.search(rf"^{name}-{p} +\[{copied[0]}, {copied[1]}\) ", format_summary(report), re.M)
    assert report.segments == sum(len(s) for s in first.values())

    # More data: the second pass starts right after what is remote and leaves it as it is.
    await produce_codecs(bootstrap, name, 3, 3_000)
    report = await asyncio.to_thread(run_pass, config, spark)
    assert_clean(report)
    second = await check_remote_log(config, name, tail_may_wait=True)
    for p, segments in second.items():
        before = first[p]
        assert segments[: len(before)] == before
        assert report.partitions[p].plan.start_offset == before[-1].end_offset + 1
        assert len(segments) > len(before)
        # Each partition holds one aborted transaction (produced last, so it was in the tail
        # that waited for the second pass); its index entry is in the segment with the ABORT
        # marker, wherever the transaction began.
        assert await aborted_transactions(config, segments) == 1
        tp = segments[0].topic_id_partition
        # No attempt failed, so nothing but the winners was ever added.
        assert all(m.state == S.COPY_SEGMENT_FINISHED for m in await all_segments(config, tp))


async def test_tier_to_s3_ships_the_tail_once_it_is_older_than_segment_ms(
        spark, kafka_cluster, topic, s3_server, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=2, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
    produced = await produce_mixed(bootstrap, name, 2, per_codec=2_000, per_transaction=100)
    config = tier_config(tmp_path, bootstrap, name, s3=s3_server, key_prefix=f"tier-{name}",
                         topic_settings={"segment.ms": 1500})
    # Every batch older than segment.ms: the tail goes too (the producer stamps records
    # slightly in the future).
    await until_older(produced, 1600)
    report = await asyncio.to_thread(run_pass, config, spark)
    assert_clean(report)
    segments = await check_remote_log(config, name, tail_may_wait=False)
    assert all(len(s) >= 2 for s in segments.values())
    assert all(p.pending_bytes == 0 for p in report.partitions)

    # Nothing new: the next pass copies nothing.
    report = await asyncio.to_thread(run_pass, config, spark)
    assert_clean(report)
    assert report.segments == 0 and all(p.plan.empty for p in report.partitions)

    # An open transaction holds the last stable offset back: nothing from it is copied.
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"open-{name}")
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(name, b"open", partition=0)
            report = await asyncio.to_thread(run_pass, config, spark)
            assert_clean(report)
            assert report.segments == 0
            p0 = report.partitions[0].plan
            assert p0.empty and p0.start_offset == p0.last_stable_offset
    finally:
        await producer.stop()


# ---------------------------------------------------------------- the loop and the lock


def test_intervals_and_retry_backoff():
    from tierproxy.tier import parse_interval_ms
    from tierproxy.config import ConfigError
    from tierproxy.storage.backoff import ExponentialBackoff

    assert [parse_interval_ms(t) for t in ("30s", "5m", "1h", "250ms", "1500")] == [30_000, 300_000, 3_600_000,
                                                                                  250, 1500]
    for bad in ("", "0s", "-1s", "1d", "s"):
        try:
            parse_interval_ms(bad)
        except ConfigError:
            continue
        raise AssertionError(f"{bad!r} accepted")
    config = parse({"bootstrap.servers": "127.0.0.1:1", "remote.log.manager.task.retry.backoff.ms": "100",
                    "remote.log.manager.task.retry.backoff.max.ms": "1000",
                    "remote.log.manager.task.retry.jitter": "0.2"})
    backoff = ExponentialBackoff.from_config(config)  # the loop's, after `failures` failed passes
    for failures, expected in ((1, 100), (2, 200), (4, 800), (5, 1000), (30, 1000)):
        assert expected * 0.8 <= backoff.backoff_ms(failures - 1) <= expected * 1.2


def test_one_pass_at_a_time_and_the_loop_retries_a_failed_pass(tmp_path, kafka_cluster):
    import threading

    from testbed.ports import free_port
    from tierproxy.pipeline.tier import PipelineBusy, pipeline_lock, run_every

    # No tiered topic in the cluster: a pass has nothing to copy and needs no Spark.
    config = tier_config(tmp_path, kafka_cluster.bootstrap_servers, "no-such-topic")
    with pipeline_lock(config):
        try:
            run_pass(config, None)
        except PipelineBusy:
            pass
        else:
            raise AssertionError("a second pass ran while the lock was held")
    assert run_pass(config, None).ok
    assert run_every(config, None, 10, max_passes=2, stop=threading.Event()) == 0

    # An unreachable cluster: every pass fails, the loop goes on with its backoff.
    down = tier_config(tmp_path, f"127.0.0.1:{free_port()}", "t",
                       extra={"remote.log.manager.task.retry.backoff.ms": 1,
                              "remote.log.manager.task.retry.backoff.max.ms": 5})
    assert run_every(down, None, 10, max_passes=3, stop=threading.Event()) == 3


def test_after_a_pass_whose_trims_were_stopped_the_loop_waits_its_interval(tmp_path, monkeypatch):
    """Damaged remote segments stay until repaired: the pass after one that found them runs
    an interval later, not after the retry backoff; a failure a retry may mend still gets it."""
    import threading
    import uuid

    import tierproxy.pipeline.tier as tier
    from tierproxy.pipeline.retention import LOCAL_RETENTION, RetentionFailure, RetentionReport
    from tierproxy.storage.model import TopicIdPartition
    from tierproxy.storage.verify import SegmentDamage
    from tests.helpers.metadata import segment

    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    damage = SegmentDamage(segment(tp, 0, 9), "missing", "orders/0/x.log", "x.log is in the manifest but missing")
    stopped = tier.PassReport(retention=RetentionReport(
        damaged=[damage], failures=[RetentionFailure(LOCAL_RETENTION, str(tp), f"trim stopped: {damage}")]))
    store_down = tier.PassReport(error="remote storage unreachable")
    both = tier.PassReport(error="remote storage unreachable", retention=stopped.retention)
    reports = iter([stopped, stopped, store_down, both, tier.PassReport()])
    monkeypatch.setattr(tier, "run_pass", lambda *args, **kwargs: next(reports))

    class Waits(threading.Event):
        """Records each wait of the loop instead of waiting."""

        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []

        def wait(self, timeout: float | None = None) -> bool:
            assert timeout is not None
            self.seconds.append(timeout)
            return False

    interval_ms = 600_000
    config = tier_config(tmp_path, "127.0.0.1:9", "orders")
    waits = Waits()
    assert tier.run_every(config, None, interval_ms, stop=waits, max_passes=5) == 0
    assert waits.seconds[:2] == [interval_ms / 1000] * 2
    assert all(w < interval_ms / 1000 / 10 for w in waits.seconds[2:]), waits.seconds  # the retry backoff
    assert stopped.retry_soon is False and store_down.retry_soon and both.retry_soon


async def log_start_offsets(bootstrap: str, name: str, partitions: int) -> list[int]:
    async with Cluster([bootstrap]) as cluster:
        topics = await cluster.topics([name])
        tps = [(name, p) for p in range(partitions)]
        return [o.offset for o in (await cluster.list_offsets(topics, tps, OffsetSpec.EARLIEST)).values()]


def _files(directory) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


async def test_a_dry_run_changes_nothing_and_says_what_the_next_pass_does(spark, kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=2, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
    await produce_codecs(bootstrap, name, 2, 2_000)
    # The first pass leaves something remote; with more data, the dry run has segments to
    # copy after it, a trim (local.retention.ms=0) and an expiry (retention.bytes).
    config = tier_config(tmp_path, bootstrap, name,
                         topic_settings={"local.retention.ms": 0, "retention.bytes": SEGMENT_BYTES})
    assert_clean(await asyncio.to_thread(run_pass, config, spark))
    await produce_codecs(bootstrap, name, 2, 2_000)
    before = (await log_start_offsets(bootstrap, name, 2), _files(tmp_path / "remote"), _files(tmp_path / "metadata"))

    dry = await asyncio.to_thread(run_pass, config, spark, dry_run=True)
    assert_clean(dry)
    assert before == (await log_start_offsets(bootstrap, name, 2), _files(tmp_path / "remote"),
                      _files(tmp_path / "metadata"))
    said = summary_json(dry)
    assert said["dry_run"] and "nothing was changed" in format_summary(dry)

    done = summary_json(await asyncio.to_thread(run_pass, config, spark))
    assert done["ok"] and not done["dry_run"]
    keys = ("topic", "partition", "copied_range", "segments", "bytes", "trimmed_to", "expired_segments")
    expected = [{k: p[k] for k in keys} for p in said["partitions"]]
    assert [{k: p[k] for k in keys} for p in done["partitions"]] == expected
    assert all(p["segments"] and p["trimmed_to"] and p["expired_segments"] for p in expected), said["partitions"]
