"""ThrottledLog: the first failure of a kind is logged at once, the same kind again within
the interval only counted, and the next line says how many were left out."""

from __future__ import annotations

import logging

import pytest

from tierproxy.remote_log.throttled_log import ThrottledLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logged(caplog):
    caplog.set_level(logging.WARNING, logger="test.throttled")
    return lambda: [r.getMessage() for r in caplog.records]


def test_one_line_per_kind_per_interval_with_the_count_left_out(logged):
    clock = Clock()
    throttled = ThrottledLog(logging.getLogger("test.throttled"), interval_s=10, clock=clock)
    for _ in range(2_850):
        throttled.log(("p0", "KeyNotFound"), logging.WARNING, "read of %s failed", "p0")
        clock.now += 0.001
    throttled.log(("p1", "KeyNotFound"), logging.WARNING, "read of %s failed", "p1")  # another partition
    assert logged() == ["read of p0 failed", "read of p1 failed"]
    clock.now += 7.5
    throttled.log(("p0", "KeyNotFound"), logging.WARNING, "read of %s failed", "p0")
    assert logged()[2:] == ["read of p0 failed (and 2,849 more in the last 10 s)"]
    clock.now += 3
    throttled.log(("p0", "KeyNotFound"), logging.WARNING, "read of %s failed", "p0")  # counted
    clock.now += 30
    throttled.log(("p0", "KeyNotFound"), logging.WARNING, "read of %s failed", "p0")
    throttled.log(("p0", "Timeout"), logging.WARNING, "read of %s timed out", "p0")  # another kind
    assert logged()[3:] == ["read of p0 failed (and 1 more in the last 33 s)", "read of p0 timed out"]


def test_a_kind_forgotten_for_room_logs_again():
    clock = Clock()
    lines = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("test.throttled.room")
    logger.addHandler(Recorder())
    throttled = ThrottledLog(logger, interval_s=10, clock=clock, max_kinds=2)
    for kind in ("a", "b", "c", "a"):
        throttled.log(kind, logging.ERROR, kind)
    assert lines == ["a", "b", "c", "a"]
