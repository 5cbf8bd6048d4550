"""OffsetForLeaderEpoch from the remote log metadata: the end offset of a leader epoch, by
Kafka's `LeaderEpochFileCache.endOffsetFor` rules, checked against the log offset by offset."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from tierproxy.storage.metadata.cache import RemoteLogMetadataCache
from tierproxy.storage.model import RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState, TopicIdPartition
from tests.helpers.metadata import segment

S = RemoteLogSegmentState
TP = TopicIdPartition(uuid.uuid4(), "orders", 0)


def _add(cache: RemoteLogMetadataCache, start: int, end: int, epochs: list[tuple[int, int]],
         *states: RemoteLogSegmentState) -> None:
    m = segment(TP, start, end, epochs)
    cache.apply(m)
    for state in states:
        cache.apply(RemoteLogSegmentMetadataUpdate(m.segment_id, 1, state, m.leader_epoch))


def _expected(epoch_of: list[int], log_start: int, requested: int) -> tuple[int, int]:
    """What a broker holding these offsets (`epoch_of[i]` the epoch of offset log_start + i)
    answers, worked out from the offsets themselves."""
    latest = epoch_of[-1]
    log_end = log_start + len(epoch_of)
    if requested == -1 or requested > latest:
        return -1, -1
    if requested == latest:
        return latest, log_end
    if requested < epoch_of[0]:
        return requested, log_start
    found = max(e for e in epoch_of if e <= requested)
    return found, log_start + next(i for i, e in enumerate(epoch_of) if e > requested)


@st.composite
def _logs(draw):
    """(log start, each offset's epoch, segment boundaries): epochs rise with gaps, segments cut anywhere."""
    log_start = draw(st.integers(0, 50))
    epochs = sorted(set(draw(st.lists(st.integers(0, 30), min_size=1, max_size=6))))
    epoch_of = [e for e in epochs for _ in range(draw(st.integers(1, 8)))]
    cuts = sorted(set(draw(st.lists(st.integers(1, len(epoch_of) - 1), max_size=5)))) if len(epoch_of) > 1 else []
    return log_start, epoch_of, [0, *cuts, len(epoch_of)]


@settings(max_examples=200, deadline=None)
@given(_logs(), st.integers(-1, 33))
def test_end_offset_of_an_epoch_is_the_first_offset_of_a_later_one(log, requested):
    log_start, epoch_of, bounds = log
    cache = RemoteLogMetadataCache()
    for lo, hi in zip(bounds, bounds[1:]):
        epochs = [(epoch_of[i], log_start + i) for i in range(lo, hi) if i == lo or epoch_of[i] != epoch_of[i - 1]]
        _add(cache, log_start + lo, log_start + hi - 1, epochs, S.COPY_SEGMENT_FINISHED)
    assert cache.end_offset_for_epoch(TP, requested) == _expected(epoch_of, log_start, requested)


def test_only_finished_segments_count():
    cache = RemoteLogMetadataCache()
    _add(cache, 0, 9, [(0, 0), (2, 5)], S.COPY_SEGMENT_FINISHED)
    _add(cache, 10, 19, [(4, 10)])  # still copying: not in the remote log yet
    assert cache.end_offset_for_epoch(TP, 0) == (0, 5)
    assert cache.end_offset_for_epoch(TP, 1) == (0, 5)
    assert cache.end_offset_for_epoch(TP, 2) == (2, 10)
    assert cache.end_offset_for_epoch(TP, 4) == (-1, -1)
    _add(cache, 20, 29, [(5, 20)], S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED)
    assert cache.end_offset_for_epoch(TP, 2) == (2, 10)


def test_a_partition_without_remote_data_knows_no_epoch():
    cache = RemoteLogMetadataCache()
    assert cache.end_offset_for_epoch(TP, 0) == (-1, -1)
    _add(cache, 0, 9, [(3, 0)])
    assert cache.end_offset_for_epoch(TP, 3) == (-1, -1)


def test_after_retention_an_older_epoch_ends_where_the_remote_log_starts():
    """Kafka answers an epoch below every one it still holds with that epoch and the first
    held epoch's start offset: a consumer there is past it and goes back to the log start."""
    cache = RemoteLogMetadataCache()
    _add(cache, 0, 9, [(1, 0)], S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED)
    _add(cache, 10, 19, [(1, 10), (3, 15)], S.COPY_SEGMENT_FINISHED)
    assert cache.end_offset_for_epoch(TP, 0) == (0, 10)
    assert cache.end_offset_for_epoch(TP, 1) == (1, 15)
    assert cache.end_offset_for_epoch(TP, 3) == (3, 20)
