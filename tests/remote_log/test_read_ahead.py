"""The read-ahead estimate: ceil(first-byte latency / chunk transfer time) + 1 chunks in flight,
within the configured bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierproxy.remote_log.read_ahead import ReadAhead

MIB = 1 << 20
seconds = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)
sizes = st.integers(min_value=1, max_value=64 * MIB)
observations = st.lists(st.tuples(seconds, seconds, sizes), max_size=30)


def test_before_any_read_it_is_the_configured_minimum() -> None:
    assert ReadAhead(2, 8).chunks(4 * MIB) == 2


def test_enough_reads_in_flight_to_cover_the_first_byte_latency() -> None:
    read_ahead = ReadAhead(1, 16)
    read_ahead.observe(0.020, 0.008, 4 * MIB)  # 20 ms first byte, 8 ms for a 4 MiB chunk
    assert read_ahead.chunks(4 * MIB) == 4  # ceil(20 / 8) + 1
    assert read_ahead.chunks(8 * MIB) == 3  # larger chunks: ceil(20 / 16) + 1
    read_ahead.observe(0.020, 0.004, 2 * MIB)  # a short last chunk counts at its size
    assert read_ahead.chunks(4 * MIB) == 4


def test_a_store_without_latency_needs_one_ahead_and_the_minimum_holds() -> None:
    read_ahead, at_least_two = ReadAhead(1, 8), ReadAhead(2, 8)
    for estimate in (read_ahead, at_least_two):
        estimate.observe(0.0, 0.002, 4 * MIB)
    assert read_ahead.chunks(4 * MIB) == 1
    assert at_least_two.chunks(4 * MIB) == 2


def test_a_minimum_of_zero_turns_read_ahead_off_whatever_the_latency() -> None:
    read_ahead = ReadAhead(0, 8)
    read_ahead.observe(0.050, 0.001, 4 * MIB)
    assert read_ahead.chunks(4 * MIB) == 0


def test_the_estimate_follows_a_change_of_latency() -> None:
    read_ahead = ReadAhead(1, 32)
    for _ in range(50):
        read_ahead.observe(0.001, 0.010, 4 * MIB)
    assert read_ahead.chunks(4 * MIB) == 2
    for _ in range(50):
        read_ahead.observe(0.100, 0.010, 4 * MIB)
    assert read_ahead.chunks(4 * MIB) == 11


@given(st.integers(0, 8), st.integers(1, 16), observations, st.integers(4096, 64 * MIB))
def test_always_within_the_bounds(minimum: int, extra: int, seen: list[tuple[float, float, int]],
                                  chunk_bytes: int) -> None:
    maximum = max(minimum, 1) + extra - 1
    read_ahead = ReadAhead(minimum, maximum)
    for first_byte, transfer, size in seen:
        read_ahead.observe(first_byte, transfer, size)
        assert minimum <= read_ahead.chunks(chunk_bytes) <= maximum


@given(seconds, st.floats(min_value=1e-6, max_value=10.0), st.floats(min_value=0.0, max_value=10.0), sizes)
def test_more_latency_never_means_fewer_chunks(first_byte: float, transfer: float, more: float, size: int) -> None:
    low, high = ReadAhead(1, 1000), ReadAhead(1, 1000)
    low.observe(first_byte, transfer, size)
    high.observe(first_byte + more, transfer, size)
    assert low.chunks(size) <= high.chunks(size)


@pytest.mark.parametrize("minimum, maximum", [(-1, 4), (0, 0), (5, 4)])
def test_bounds_that_make_no_sense_are_refused(minimum: int, maximum: int) -> None:
    with pytest.raises(ValueError):
        ReadAhead(minimum, maximum)
