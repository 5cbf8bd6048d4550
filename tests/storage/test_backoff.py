"""Kafka's exponential backoff: growth, the maximum, jitter, and the configuration keys."""

from __future__ import annotations

import pytest

from tierproxy.config import parse
from tierproxy.storage.backoff import ExponentialBackoff

KAFKA_DEFAULTS = ExponentialBackoff(500, 30_000, 0.2)


def low(lo: float, hi: float) -> float:
    return lo


def high(lo: float, hi: float) -> float:
    return hi


def test_backoff_doubles_up_to_the_maximum() -> None:
    no_jitter = ExponentialBackoff(500, 30_000, 0.0)
    assert [no_jitter.backoff_ms(a) for a in range(9)] == [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
    assert no_jitter.backoff_ms(10_000) == 30_000  # no overflow on long outages
    assert ExponentialBackoff(100, 10_000, 0.0, multiplier=3).backoff_ms(2) == 900


def test_backoff_jitter_stays_within_its_band() -> None:
    assert [KAFKA_DEFAULTS.backoff_ms(a, uniform=low) for a in range(4)] == pytest.approx([400, 800, 1600, 3200])
    assert [KAFKA_DEFAULTS.backoff_ms(a, uniform=high) for a in range(4)] == pytest.approx([600, 1200, 2400, 4800])
    assert KAFKA_DEFAULTS.backoff_ms(7, uniform=high) == 30_000  # capped after jitter
    assert KAFKA_DEFAULTS.backoff_ms(7, uniform=low) == pytest.approx(24_000)  # jitter applies below the cap too
    delays = {KAFKA_DEFAULTS.backoff_ms(2) for _ in range(50)}
    assert all(1600 <= d <= 2400 for d in delays) and len(delays) > 1


def test_the_random_factor_is_drawn_from_one_minus_to_one_plus_jitter() -> None:
    asked = []
    ExponentialBackoff(100, 1000, 0.25).backoff_ms(0, uniform=lambda lo, hi: asked.append((lo, hi)) or lo)
    assert asked == [(0.75, 1.25)]


def test_bounds() -> None:
    # Zero initial backoff: never waits (as Kafka's). Initial equal to the maximum: constant, no jitter.
    assert ExponentialBackoff(0, 1000, 0.5).backoff_ms(50, uniform=high) == 0
    assert {ExponentialBackoff(200, 200, 0.5).backoff_ms(a) for a in range(5)} == {200}
    for attempts in range(40):
        assert 0 <= KAFKA_DEFAULTS.backoff_ms(attempts) <= 30_000
    for bad in ((100, 50, 0.2), (-1, 50, 0.2), (100, 1000, -0.1), (100, 1000, 1.5)):
        with pytest.raises(ValueError):
            ExponentialBackoff(*bad)
    with pytest.raises(ValueError, match="multiplier"):
        ExponentialBackoff(100, 1000, 0.2, multiplier=1)


def test_from_the_configuration() -> None:
    config = parse({"bootstrap.servers": "127.0.0.1:1", "remote.log.manager.task.retry.backoff.ms": "100",
                    "remote.log.manager.task.retry.backoff.max.ms": "1000",
                    "remote.log.manager.task.retry.jitter": "0.1"})
    assert ExponentialBackoff.from_config(config) == ExponentialBackoff(100, 1000, 0.1)
    assert ExponentialBackoff.from_config(parse({"bootstrap.servers": "127.0.0.1:1"})) == KAFKA_DEFAULTS


def test_a_read_deadline_bounds_retries_and_nests():
    from tierproxy.storage.backoff import read_deadline, retry_fits

    assert retry_fits(3600)  # no fetch waiting: the retry budget is the attempts alone
    with read_deadline(0.5):
        assert retry_fits(0.1) and not retry_fits(0.6)
        with read_deadline(0.05):
            assert not retry_fits(0.1)
        assert retry_fits(0.1)
    with read_deadline(None):
        assert retry_fits(3600)
    assert retry_fits(3600)
