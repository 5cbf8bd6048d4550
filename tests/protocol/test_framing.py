"""Frame decoding from arbitrarily chunked streams, and its failure modes."""

import struct

import pytest

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from tierproxy.protocol.errors import FrameError
from tierproxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES
from tierproxy.protocol.framing import FrameDecoder
from tierproxy.protocol.framing import encode_frame
from tierproxy.protocol.framing import split_frames


def frame(body: bytes) -> bytes:
    return b"".join(encode_frame(body))


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(0, 10_000), max_size=30))
def test_bodies_survive_any_chunking(bodies, cuts):
    stream = b"".join(frame(b) for b in bodies)
    decoder = FrameDecoder()
    received = []
    for chunk in chunked(stream, cuts):
        received.extend(bytes(body) for body in decoder.feed(chunk))
    decoder.at_eof()
    assert received == bodies
    assert decoder.pending_bytes == 0


def test_big_frame_in_small_chunks():
    body = bytes(range(256)) * 20_000  # about 5 MB
    stream = frame(body) + frame(b"next")
    decoder = FrameDecoder()
    out = []
    for i in range(0, len(stream), 1000):
        out.extend(decoder.feed(stream[i : i + 1000]))
    assert [bytes(b) for b in out] == [body, b"next"]


def test_handed_out_bodies_stay_valid_after_more_data():
    decoder = FrameDecoder()
    (first,) = decoder.feed(frame(b"first") + frame(b"sec")[:5])
    decoder.feed(frame(b"sec")[5:] + frame(b"x" * 10_000))
    assert bytes(first) == b"first"


def test_negative_size_is_refused():
    with pytest.raises(FrameError, match="negative frame size -1"):
        FrameDecoder().feed(struct.pack(">i", -1))


def test_oversized_frame_is_refused_before_its_body_arrives():
    decoder = FrameDecoder(max_frame_bytes=100)
    with pytest.raises(FrameError, match="frame size 101 exceeds the maximum of 100"):
        decoder.feed(struct.pack(">i", 101))


def test_frame_of_exactly_the_maximum_is_accepted():
    decoder = FrameDecoder(max_frame_bytes=100)
    assert [bytes(b) for b in decoder.feed(frame(b"a" * 100))] == [b"a" * 100]


def test_default_maximum_is_socket_request_max_bytes():
    assert DEFAULT_MAX_FRAME_BYTES == 100 * 1024 * 1024
    assert FrameDecoder().max_frame_bytes == DEFAULT_MAX_FRAME_BYTES


def test_truncated_body_at_eof():
    decoder = FrameDecoder()
    assert decoder.feed(frame(b"0123456789")[:7]) == []
    with pytest.raises(FrameError, match="truncated frame: 3 of 10 bytes"):
        decoder.at_eof()


def test_truncated_size_prefix_at_eof():
    decoder = FrameDecoder()
    decoder.feed(b"\x00\x00")
    with pytest.raises(FrameError, match="truncated frame: 2 of 4 size bytes"):
        decoder.close()
    decoder.close()  # the truncated bytes were dropped


def test_discard_drops_a_partial_frame_unchecked():
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">i", 1000) + b"x" * 600)
    decoder.discard()
    assert decoder.pending_bytes == 0
    decoder.at_eof()  # nothing truncated is left to complain about


def test_empty_frame_body():
    assert [bytes(b) for b in FrameDecoder().feed(frame(b""))] == [b""]


def test_max_frame_bytes_must_fit_the_size_prefix():
    with pytest.raises(ValueError):
        FrameDecoder(max_frame_bytes=2**31)


def test_encode_frame_keeps_parts_unjoined():
    a, b = b"head", memoryview(b"payload")
    prefix, *parts = encode_frame(a, b)
    assert prefix == struct.pack(">i", 11)
    assert parts[0] is a and parts[1] is b


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=100), max_size=6))
def test_split_frames_round_trip(bodies):
    stream = b"".join(frame(b) for b in bodies)
    assert [bytes(b) for b in split_frames(stream)] == bodies


def test_split_frames_refuses_a_truncated_tail():
    with pytest.raises(FrameError, match="truncated frame: 1 of 3 bytes"):
        split_frames(frame(b"ok") + frame(b"abc")[:5])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=10))
def test_garbage_raises_only_frame_error(chunks):
    decoder = FrameDecoder(max_frame_bytes=1000)
    try:
        for chunk in chunks:
            for body in decoder.feed(chunk):
                assert len(body) <= 1000
        decoder.at_eof()
    except FrameError:
        pass
