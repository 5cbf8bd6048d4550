"""KIP-956's fetch quota (`remote.log.manager.fetch.max.bytes.per.second`): a backfill from
the remote tier is held to the quota, its remote partitions answered with empty records
and no error while it is exceeded, and the partitions the broker serves are not held."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition

from tierproxy.storage.quota import RateQuota, QuotaSettings
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
