"""KIP-956's fetch quota (`remote.log.manager.fetch.max.bytes.per.second`): a backfill from
the remote tier is held to the quota, its remote partitions answered with empty records
and no error while it is exceeded, and the partitions the broker serves are not held.
Bytes count as the store reads them, read-ahead included, and consumers take turns: every
quota window keeps to the quota, and no consumer is passed over for long."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition

from tierproxy.storage.quota import RateQuota, QuotaSettings
from testbed.ports import LOOPBACK, free_ports
from testbed.quota_replay import replay
from tests.helpers.proxy import free_port_block
from tests.helpers.serve import start_serving
from tests.helpers.tiered import Timed, TieredTopic, TopicSpec

QUOTA = 256 * 1024  # bytes per second
VALUE_SIZE = 1000
PER_PARTITION = 1800  # ~1.8 MB a partition: partition 0 almost all remote, partition 1 all local
SPEC = TopicSpec(Timed(PER_PARTITION, value_size=VALUE_SIZE), partitions=2, fraction=0.95, tier=(0,),
                 segment_bytes=256 * 1024)
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def tiered(kafka_cluster, tiered_topics) -> TieredTopic:
    data = tiered_topics(SPEC, kafka_cluster)
    assert data.boundary[1] == 0 and data.boundary[0] > PER_PARTITION * 0.9
    return data


def _replay(proxy, data: TieredTopic) -> tuple[float, dict[int, float], list]:
    """Seconds to read every record of both partitions from offset 0 (librdkafka, no
    group), when each partition was complete, and the errors the consumer reported."""
    wanted = {p: len(data.of(p)) for p in (0, 1)}
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap_servers, "group.id": f"q-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "fetch.error.backoff.ms": 100})
    consumer.assign([TopicPartition(data.topic, p, 0) for p in (0, 1)])
    seen: dict[int, list[int]] = {0: [], 1: []}
    done: dict[int, float] = {}
    errors: list = []
    started = time.monotonic()
    try:
        while len(done) < 2 and time.monotonic() - started < 120:
            for message in consumer.consume(500, timeout=0.2):
                if message.error() is not None:
                    errors.append(message.error())
                    continue
                seen[message.partition()].append(message.offset())
                if len(seen[message.partition()]) == wanted[message.partition()]:
                    done[message.partition()] = time.monotonic() - started
    finally:
        consumer.close()
    for partition in (0, 1):
        assert seen[partition] == [r.offset for r in data.of(partition)]
    return time.monotonic() - started, done, errors


def test_a_backfill_is_held_to_the_fetch_quota_and_local_partitions_are_not(tiered):
    data = tiered
    remote_bytes = sum(len(r.value) + len(r.key) for r in data.remote(0))
    allowed_s = remote_bytes / QUOTA
    settings = {"remote.log.manager.fetch.max.bytes.per.second": QUOTA, "remote.log.manager.fetch.quota.window.num": 2}
    with data.proxy() as free:
        unthrottled, _, errors = _replay(free, data)
    assert not errors
    with data.proxy(**settings) as proxy:
        elapsed, done, errors = _replay(proxy, data)
        throttled = proxy.metrics.registry.get_sample_value("tierproxy_remote_fetch_throttle_seconds_count") or 0
    print(f"{remote_bytes} remote bytes at {QUOTA} B/s: {elapsed:.1f} s with the quota ({allowed_s:.1f} s allowed),"
          f" {unthrottled:.1f} s without; local partition done after {done.get(1, -1):.1f} s")
    assert not errors  # throttled partitions get empty records, never an error
    assert throttled > 0
    # Held to the quota: not faster than it allows (one window's burst aside), and not
    # starved; without the quota the same replay is much faster.
    assert elapsed >= 0.75 * allowed_s
    assert elapsed <= 2.5 * allowed_s
    assert unthrottled < 0.5 * allowed_s
    # The broker's partition is served all along, not after the remote one.
    assert done[1] < 0.5 * done[0]


# Eight consumers, one a partition, each Fetch of at most 32 KiB of a partition, against a
# quota of 400 KB/s over windows of 2 x 1 s: one window is 800 KB, 10% of it 80 KB.
WINDOWS_QUOTA = 400_000
WINDOWS = TopicSpec(Timed(1000, value_size=1000), partitions=8, fraction=0.99, segment_bytes=256 * 1024)
WINDOWS_SETTINGS = {"remote.log.manager.fetch.max.bytes.per.second": WINDOWS_QUOTA,
                    "remote.log.manager.fetch.quota.window.num": 2,
                    "remote.log.manager.fetch.quota.window.size.seconds": 1,
                    "remote.log.chunk.size.bytes": 32 * 1024}
WINDOWS_CONSUMER = {"max.partition.fetch.bytes": 32 * 1024}


@pytest.mark.parametrize("workers", [1, 2])
def test_every_quota_window_keeps_to_the_quota_and_consumers_take_turns(kafka_cluster, tiered_topics, tmp_path,
                                                                         workers):
    """Every quota window after the first reads at most 1.1x the quota from the store
    (bytes counted as read, read-ahead too), the backfill takes at least 0.9x bytes /
    quota, and no consumer waits two windows while others get records."""
    data = tiered_topics(WINDOWS, kafka_cluster)
    bootstrap_port, metrics_port = free_ports(2)
    settings = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "proxy.listener.host": LOOPBACK,
                "proxy.bootstrap.port": bootstrap_port, "proxy.broker.port.base": free_port_block(1),
                "metrics.port": metrics_port, "proxy.workers": workers, **data.store, **WINDOWS_SETTINGS}
    proxy = start_serving(settings, tmp_path)
    try:
        proxy.wait_for("tierproxy serving on", count=workers)
        result = replay(f"{LOOPBACK}:{bootstrap_port}", data.topic,
                        {p: len(data.of(p)) for p in range(WINDOWS.partitions)}, metrics_port,
                        quota=WINDOWS_QUOTA, window_s=2.0, consumer_config=WINDOWS_CONSUMER, timeout_s=150)
    finally:
        assert proxy.stop() == 0, proxy.output
    print(f"{workers} worker(s): {result.line()}")
    assert result.windows >= 10
    assert result.max_window <= 1.1
    assert result.duration >= 0.9
    assert result.longest_wait_s <= 2 * 2.0


def test_throttle_time_follows_kafkas_rate_over_the_kept_samples():
    now = [100.0]
    quota = RateQuota(QuotaSettings(1000, 3, 1), clock=lambda: now[0])
    assert quota.throttle_time() == 0
    quota.record(3000)  # 3000 bytes over one window: 3x the quota
    assert quota.throttle_time() == pytest.approx((3000 - 1000) / 1000 * 1)
    now[0] += 2.0  # the rate is now 3000 over 2 s
    assert quota.throttle_time() == pytest.approx((1500 - 1000) / 1000 * 2)
    now[0] += 1.5
    assert quota.throttle_time() == 0
