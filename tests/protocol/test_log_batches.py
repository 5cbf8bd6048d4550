"""log_batches: the one reassembly of a log read in chunks, on batches built by kio's writer."""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.records import iter_batches, log_batches, log_batches_async

from tests.helpers.batches import batch_shapes, build_log


def _cuts(data: st.DataObject, size: int) -> list[int]:
    """Sorted, distinct chunk boundaries strictly inside a log of `size` bytes."""
    return sorted(set(data.draw(st.lists(st.integers(1, max(size - 1, 1)), max_size=12)))) if size > 1 else []


def _chunked(log: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *cuts, len(log)]
    return [log[a:b] for a, b in zip(edges, edges[1:])]


def _seen(batches) -> list[tuple[int, bytes]]:
    return [(b.position, bytes(b.view)) for b in batches]


@given(batch_shapes, st.data(), st.booleans())
@settings(max_examples=200, deadline=None)
def test_every_chunking_gives_the_batches_of_one_chunk(shapes, data, size_known):
    log, _ = build_log(shapes)
    whole = _seen(log_batches([log]))
    assert whole == [(h.position, log[h.position:h.end_position]) for h in iter_batches(log)]
    chunks = _chunked(log, _cuts(data, len(log)))
    batches = list(log_batches(chunks, end=len(log) if size_known else None))
    assert _seen(batches) == whole
    # A batch inside one chunk is a view of that chunk; a batch cut by a boundary is views of
    # its parts in the chunks it spans, nothing copied but its header.
    starts = [0]
    for chunk in chunks:
        starts.append(starts[-1] + len(chunk))
    for b in batches:
        inside = [c for c, s in zip(chunks, starts) if s <= b.position and b.position + b.header.size <= s + len(c)]
        if inside:
            assert b.buffer is inside[0] and not b.cut
            assert b.parts == (b.view,)
        else:
            assert len(b.cut) >= 2 and sum(len(part) for part in b.cut) == b.header.size
            assert all(any(part.obj is chunk for chunk in chunks) for part in b.cut)
            assert b"".join(b.parts) == bytes(b.view)
        assert b.crc_valid()


@given(batch_shapes, st.data())
@settings(max_examples=100, deadline=None)
def test_async_chunks_give_the_same_batches(shapes, data):
    log, _ = build_log(shapes)
    chunks = _chunked(log, _cuts(data, len(log)))

    async def arrive():
        for chunk in chunks:
            await asyncio.sleep(0)
            yield chunk

    async def collect():
        return [b async for b in log_batches_async(arrive(), end=len(log))]

    assert _seen(asyncio.run(collect())) == _seen(log_batches([log]))


@given(batch_shapes, st.data(), st.booleans())
@settings(max_examples=200, deadline=None)
def test_a_log_ending_inside_a_batch_is_an_error_naming_its_position(shapes, data, size_known):
    log, _ = build_log(shapes)
    headers = list(iter_batches(log))
    cut_batch = data.draw(st.sampled_from(headers))
    end = data.draw(st.integers(cut_batch.position + 1, cut_batch.end_position - 1))
    truncated = log[:end]
    chunks = _chunked(truncated, _cuts(data, len(truncated)))
    served = []
    with pytest.raises(DecodeError, match=f"at byte {cut_batch.position}\\b"):
        for b in log_batches(chunks, end=len(truncated) if size_known else None):
            served.append(b.position)
    assert served == [h.position for h in headers if h.end_position <= cut_batch.position]


def test_a_walk_can_start_inside_the_log():
    log, _ = build_log([(3, 40)] * 6)
    headers = list(iter_batches(log))
    start = headers[2].position
    rest = log[start:]
    chunks = [rest[:50], rest[50:51], rest[51:]]
    assert [b.position for b in log_batches(chunks, position=start, end=len(log))] == \
        [h.position for h in headers[2:]]


def test_the_next_chunk_is_asked_for_only_when_a_batch_needs_it():
    log, _ = build_log([(2, 100)] * 8)
    headers = list(iter_batches(log))
    asked = []

    def chunks():
        for i in range(0, len(log), 64):
            asked.append(i)
            yield log[i:i + 64]

    walk = log_batches(chunks(), end=len(log))
    first = next(walk)
    assert first.header.base_offset == 0
    assert asked == [i for i in range(0, len(log), 64) if i < headers[0].end_position]
    # Reading to the end asks for each chunk once and nothing past the last.
    rest = list(walk)
    assert len(rest) == len(headers) - 1
    assert asked == list(range(0, len(log), 64))


def test_a_length_running_past_the_end_fails_before_the_chunks_it_would_need():
    log, _ = build_log([(2, 100)] * 4)
    headers = list(iter_batches(log))
    broken = bytearray(log)
    struct.pack_into(">i", broken, headers[1].position + 8, 1 << 30)
    asked = []

    def chunks():
        for i in range(0, len(broken), 100):
            asked.append(i)
            yield bytes(broken[i:i + 100])

    with pytest.raises(DecodeError, match=f"record batch at byte {headers[1].position} .* runs past the end"):
        list(log_batches(chunks(), end=len(broken)))
    assert max(asked) < headers[1].position + 100


def test_bytes_that_cannot_be_a_batch_name_their_position_in_the_log():
    log, _ = build_log([(2, 30)] * 3)
    headers = list(iter_batches(log))
    broken = bytearray(log)
    broken[headers[2].position + 16] = 7  # magic
    chunks = [bytes(broken[:headers[2].position + 5]), bytes(broken[headers[2].position + 5:])]
    with pytest.raises(DecodeError, match=f"record batch at byte {headers[2].position} has magic 7"):
        list(log_batches(chunks))


def test_a_cut_batch_fails_its_crc_when_any_part_is_damaged():
    log, _ = build_log([(3, 100)] * 2)
    first = next(iter_batches(log))
    for flipped in (first.position + 30, first.end_position - 1):  # before and after the cut
        damaged = bytearray(log)
        damaged[flipped] ^= 0xFF
        middle = first.position + first.size // 2
        (batch, *_) = log_batches([bytes(damaged[:middle]), bytes(damaged[middle:])])
        assert batch.cut and not batch.crc_valid()
    (intact, *_) = log_batches([log[:first.size // 2], log[first.size // 2:]])
    assert intact.cut and intact.crc_valid()
