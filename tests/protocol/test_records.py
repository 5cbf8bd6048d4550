"""The record-batch header walker, on batches built by kio's writer."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.records import (
    CRC_OFFSET,
    HEADER_SIZE,
    Compression,
    ControlType,
    control_type,
    crc_valid,
    iter_batches,
    read_batch_header,
)
from tests.helpers.batches import batch, batch_shapes, build_log, control_batch


@given(batch_shapes, st.integers(0, 2**40), st.integers(0, 1000))
@settings(max_examples=150, deadline=None)
def test_walk_finds_every_batch_with_contiguous_offsets(shapes, base_offset, epoch):
    log, ranges = build_log(shapes, base_offset, epoch)
    headers = list(iter_batches(log, verify_crc=True))
    assert [(h.base_offset, h.last_offset) for h in headers] == ranges
    assert all(h.partition_leader_epoch == epoch and h.magic == 2 for h in headers)
    assert headers[0].position == 0 and headers[-1].end_position == len(log)
    for previous, current in zip(headers, headers[1:]):
        assert current.position == previous.end_position
        assert current.base_offset == previous.next_offset
    assert all(h.compression is Compression.NONE and not h.is_control for h in headers)


@given(batch_shapes, st.data())
@settings(max_examples=150, deadline=None)
def test_partial_trailing_batch_is_dropped(shapes, data):
    log, ranges = build_log(shapes)
    cut = data.draw(st.integers(0, len(log)))
    headers = list(iter_batches(log[:cut]))
    whole = [r for r, h_end in zip(ranges, _ends(log)) if h_end <= cut]
    assert [(h.base_offset, h.last_offset) for h in headers] == whole


def _ends(log):
    return [h.end_position for h in iter_batches(log)]


def test_control_batches_and_their_type():
    log = (
        batch(0, 3, producer_id=9, producer_epoch=1, transactional=True)
        + control_batch(3, ControlType.ABORT, producer_id=9, producer_epoch=1)
        + control_batch(4, ControlType.COMMIT, producer_id=10)
    )
    headers = list(iter_batches(log, verify_crc=True))
    assert [h.is_control for h in headers] == [False, True, True]
    assert all(h.is_transactional for h in headers)
    assert headers[1].producer_id == 9
    assert control_type(log, headers[1]) is ControlType.ABORT
    assert control_type(log, headers[2]) is ControlType.COMMIT
    with pytest.raises(ValueError):
        control_type(log, headers[0])


def test_crc_mismatch_is_detected():
    log = bytearray(batch(0, 4, value_size=50))
    log[-1] ^= 0xFF
    header = read_batch_header(log)
    assert not crc_valid(log, header)
    with pytest.raises(DecodeError, match="CRC"):
        list(iter_batches(log, verify_crc=True))
    # A corrupt stored CRC is caught the same way.
    log = bytearray(batch(0, 4))
    struct.pack_into(">I", log, CRC_OFFSET, 12345)
    assert not crc_valid(log, read_batch_header(log))


def test_wrong_magic_and_impossible_length_are_decode_errors():
    log = bytearray(batch(0, 1))
    log[16] = 1
    with pytest.raises(DecodeError, match="magic"):
        list(iter_batches(log))
    bad = struct.pack(">qi", 0, 10) + bytes(60)
    with pytest.raises(DecodeError, match="length"):
        list(iter_batches(bad))


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_garbage_only_ever_raises_decode_error(data):
    try:
        for header in iter_batches(data, verify_crc=True):
            assert header.end_position <= len(data)
            if header.is_control:
                control_type(data, header)
    except DecodeError:
        pass


def test_header_size_is_kafkas():
    assert HEADER_SIZE == 61
