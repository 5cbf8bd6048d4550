"""storage.shared_quota: the workers of one `tierproxy serve` share one fetch quota. What one
process records and sets aside counts in another's rate, as it would in one process; many
processes recording at once lose nothing; a restarted worker's old reservation is void."""

from __future__ import annotations

import multiprocessing

import pytest

from tierproxy.storage.quota import QuotaSettings, RateQuota, SampledRate
from tierproxy.storage.shared_quota import SharedQuotaFile, SharedSampledRate, create

SETTINGS = QuotaSettings(1000, 3, 1)  # 1000 B/s over 3 samples of 1 s


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _shared_quota(path: str, worker: int, clock: Clock) -> RateQuota:
    shared = SharedQuotaFile(path, worker)
    return RateQuota(SETTINGS, clock=clock, rate=SharedSampledRate(shared, SETTINGS.window_size_s))


def _record(path: str, worker: int, records: list[tuple[float, int]]) -> None:
    clock = Clock()
    quota = _shared_quota(path, worker, clock)
    for now, nbytes in records:
        clock.now = now
        quota.record(nbytes)


def _hold(path: str, worker: int, nbytes: int, held, release) -> None:
    quota = _shared_quota(path, worker, Clock())
    with quota.reserve(nbytes):
        held.set()
        release.wait(30)


def _in_process(target, *args) -> None:
    process = multiprocessing.get_context("spawn").Process(target=target, args=args)
    process.start()
    process.join(60)
    assert process.exitcode == 0


@pytest.fixture
def path(tmp_path) -> str:
    path = str(tmp_path / "fetch-quota")
    create(path, SETTINGS.window_num, 2)
    return path


def test_one_rate_over_two_processes_is_the_rate_of_one_process(path):
    records = [(1000.0, 600), (1000.5, 700), (1001.2, 400), (1002.6, 900), (1003.1, 300)]
    _in_process(_record, path, 0, records[:3])  # one worker, then the other, in time order
    _in_process(_record, path, 1, records[3:])
    clock = Clock()
    alone = RateQuota(SETTINGS, clock=clock)
    for clock.now, nbytes in records:
        alone.record(nbytes)
    shared = _shared_quota(path, 0, clock)
    for clock.now in (1003.1, 1003.5, 1004.4, 1006.0):
        assert shared.rate.measure(clock.now) == pytest.approx(alone.rate.measure(clock.now))
        assert shared.throttle_time() == pytest.approx(alone.throttle_time())
        assert shared.allows(100) == alone.allows(100)


def test_processes_recording_at_once_lose_nothing(tmp_path):
    path = str(tmp_path / "fetch-quota")
    create(path, 1, 4)  # one sample of 1 s: a window that holds everything recorded below
    processes = [multiprocessing.get_context("spawn").Process(
        target=_record, args=(path, worker, [(1000.0 + i / 1000, 1) for i in range(500)])) for worker in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    rate = SharedSampledRate(SharedQuotaFile(path, 0), 1)
    assert rate.measure(1000.9) == pytest.approx(2000)  # 4 x 500 bytes in one window of 1 s


def test_bytes_another_worker_sets_aside_count_until_its_reads_are_done(path):
    context = multiprocessing.get_context("spawn")
    held, release = context.Event(), context.Event()
    other = context.Process(target=_hold, args=(path, 1, 2500, held, release))
    other.start()
    try:
        assert held.wait(30)
        quota = _shared_quota(path, 0, Clock())
        assert not quota.allows(1000)  # 2500 set aside elsewhere + 1000 over one window of 1 s
        assert quota.throttle_time() == pytest.approx(1.5)  # (2500 - 1000) / 1000 x 1 s
        release.set()
        other.join(30)
        assert other.exitcode == 0
        assert quota.allows(1000)
    finally:
        release.set()
        other.join(30)


def test_a_restarted_worker_starts_with_nothing_set_aside(path):
    clock = Clock()
    crashed = _shared_quota(path, 1, clock)
    crashed.reserved = 5000
    crashed.rate.set_reserved(5000)  # as if it died inside `reserve`
    survivor = _shared_quota(path, 0, clock)
    assert not survivor.allows(0)
    _shared_quota(path, 1, clock)  # the supervisor restarts worker 1
    assert survivor.allows(0)


def test_a_worker_index_outside_the_file_is_an_error(path):
    with pytest.raises(ValueError, match="worker 2 of a fetch quota file for 2"):
        SharedQuotaFile(path, 2)


def test_the_shared_rate_keeps_kafkas_sampled_rate():
    """A shared rate alone is `SampledRate` itself (the single process path)."""
    assert issubclass(SharedSampledRate, SampledRate)
