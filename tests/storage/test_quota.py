"""storage.quota: Kafka's byte-rate quota (KIP-956's RLMQuotaManager over a SimpleRate),
checked against the figures of Kafka's own RLMQuotaManagerTest, then waiting for real."""

from __future__ import annotations

import time

import pytest

from tierproxy.config import UNLIMITED_BYTES_PER_SECOND, parse
from tierproxy.storage.quota import QuotaSettings, RateQuota, SampledRate, copy_quota_settings, fetch_quota_settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_throttle_time_is_kafkas():
    """Kafka's testQuotaExceeded: 50 B/s over 11 windows of 1 s, 500 bytes at once."""
    clock = Clock()
    quota = RateQuota(QuotaSettings(50, 11, 1), clock=clock)
    assert quota.throttle_time() == 0
    quota.record(500)
    clock.now += 1
    assert quota.throttle_time() == pytest.approx(9.0)  # (500/1 - 50) / 50 * 1 s
    clock.now += 8
    assert quota.throttle_time() == pytest.approx(1.0)  # (500/9 - 50) / 50 * 9 s
    clock.now += 1
    assert quota.throttle_time() == 0  # 500 / 10 s is the quota itself


def test_a_record_just_over_the_quota_throttles_and_an_update_clears_it():
    """Kafka's testQuotaUpdate: 51 bytes in the first second of a 50 B/s quota."""
    clock = Clock()
    quota = RateQuota(QuotaSettings(50, 11, 1), clock=clock)
    quota.record(51)
    assert quota.throttle_time() > 0
    quota.settings = QuotaSettings(60, 11, 1)
    assert quota.throttle_time() == 0


def test_samples_older_than_all_windows_are_forgotten():
    clock = Clock()
    rate = SampledRate(samples=3, window_s=1.0)
    rate.record(300, clock.now)
    clock.now += 1.5
    rate.record(300, clock.now)  # a second sample
    assert rate.window_size(clock.now) == pytest.approx(1.5)
    assert rate.measure(clock.now) == pytest.approx(600 / 1.5)
    clock.now += 2.0  # the first sample is 3.5 s old: past 3 windows
    assert rate.measure(clock.now) == pytest.approx(300 / 2.0)
    clock.now += 10
    assert rate.measure(clock.now) == 0
    with pytest.raises(ValueError):
        SampledRate(samples=0, window_s=1.0)


def test_samples_are_reused_round_robin():
    clock = Clock()
    rate = SampledRate(samples=2, window_s=1.0)
    for _ in range(5):  # five windows through two samples
        rate.record(100, clock.now)
        clock.now += 1.0
    clock.now -= 0.5
    assert rate.measure(clock.now) == pytest.approx(200 / 1.5)


def test_the_default_is_no_quota_and_shares_divide_it():
    config = parse({"bootstrap.servers": "k:9092"})
    copy, fetch = copy_quota_settings(config), fetch_quota_settings(config)
    assert copy == fetch == QuotaSettings(UNLIMITED_BYTES_PER_SECOND, 11, 1)
    assert not copy.enabled and copy.share(4) == copy
    quota = RateQuota(copy)
    quota.record(10**15)
    assert quota.throttle_time() == 0
    limited = copy_quota_settings(parse({"bootstrap.servers": "k:9092",
                                         "remote.log.manager.copy.max.bytes.per.second": "1000",
                                         "remote.log.manager.copy.quota.window.num": "5",
                                         "remote.log.manager.copy.quota.window.size.seconds": "2"}))
    assert limited == QuotaSettings(1000, 5, 2) and limited.enabled
    assert limited.share(3) == QuotaSettings(333, 5, 2)
    assert limited.share(5000).bytes_per_second == 1


async def test_acquire_waits_until_the_rate_is_back_within_the_quota():
    """8 chunks of 100 KB through a 400 KB/s quota take about 700 KB / 400 KB/s. The rate
    counts at least one window (Kafka's SimpleRate), so the first 400 KB and the chunk
    that reaches the quota exactly go at once; each later one waits until the rate since
    the first chunk allows it. Without the quota they would take no time at all."""
    chunk, chunks, bound = 100_000, 8, 400_000
    quota = RateQuota(QuotaSettings(bound, 11, 1))
    started = time.monotonic()
    waited = [await quota.acquire(chunk) for _ in range(chunks)]
    elapsed = time.monotonic() - started
    expected = (chunks - 1) * chunk / bound
    assert 0.9 <= elapsed / expected <= 1.5, (elapsed, expected)
    assert waited[:5] == [0.0] * 5 and all(w > 0 for w in waited[5:])
    assert quota.waits == waited[5:]
    assert sum(quota.waits) == pytest.approx(elapsed, rel=0.2)

    unlimited = RateQuota(QuotaSettings(UNLIMITED_BYTES_PER_SECOND, 11, 1))
    started = time.monotonic()
    for _ in range(chunks):
        assert await unlimited.acquire(chunk) == 0
    assert time.monotonic() - started < 0.5 * expected
    assert unlimited.waits == []


def test_reserved_bytes_count_as_recorded_until_released():
    """Reads admitted and not started yet count against the quota, so that reads admitted
    at once do not all pass the same check; `throttle_time(n)` is the wait for n more."""
    clock = Clock()
    quota = RateQuota(QuotaSettings(1000, 11, 1), clock=clock)
    with quota.reserve(900):
        assert quota.allows(100) and not quota.allows(101)
        assert quota.throttle_time(600) == pytest.approx((1500 - 1000) / 1000 * 1)
        assert quota.throttle_time() == 0
    assert quota.reserved == 0 and quota.allows(1000)
