"""The shared remote log metadata state: transitions, lookups by epoch, lineage, truncation."""

from __future__ import annotations

import itertools
import uuid

import pytest

from tierproxy.storage.errors import IllegalStateTransition
from tierproxy.storage.metadata.cache import (
    DuplicateSegment,
    RemoteLogMetadataCache,
    UnknownSegment,
    is_segment_within_lineage,
)
from tierproxy.storage.metadata.serde import RemoteLogTruncation
from tierproxy.storage.model import RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState, TopicIdPartition
from tierproxy.storage.model import RemotePartitionDeleteMetadata, RemotePartitionDeleteState
from tests.helpers.metadata import segment

S = RemoteLogSegmentState
P = RemotePartitionDeleteState
TP = TopicIdPartition(uuid.uuid4(), "orders", 0)
LEGAL_SEGMENT = {(S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED), (S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED),
                 (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED), (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED)}
LEGAL_PARTITION = {(None, P.DELETE_PARTITION_MARKED), (P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED),
                   (P.DELETE_PARTITION_STARTED, P.DELETE_PARTITION_FINISHED)}
# The path that reaches each state from COPY_SEGMENT_STARTED.
PATH = {S.COPY_SEGMENT_STARTED: [], S.COPY_SEGMENT_FINISHED: [S.COPY_SEGMENT_FINISHED],
        S.DELETE_SEGMENT_STARTED: [S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED],
        S.DELETE_SEGMENT_FINISHED: [S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED]}


def update(m, state, epoch=0):
    return RemoteLogSegmentMetadataUpdate(m.segment_id, 1, state, epoch)


def finished(cache, m):
    cache.apply(m)
    cache.apply(update(m, S.COPY_SEGMENT_FINISHED))
    return cache.segment(m.segment_id)


@pytest.mark.parametrize("current, target", list(itertools.product(S, S)))
def test_every_segment_transition(current, target):
    cache = RemoteLogMetadataCache()
    m = segment(TP, 0, 9, [(0, 0)])
    cache.apply(m)
    for state in PATH[current]:
        cache.apply(update(m, state))
    if current == S.DELETE_SEGMENT_FINISHED:
        # Forgotten, as Kafka does: any further update names an unknown segment.
        assert cache.segment(m.segment_id) is None
        with pytest.raises(UnknownSegment):
            cache.apply(update(m, target))
        return
    if (current, target) in LEGAL_SEGMENT:
        cache.apply(update(m, target))
        if target != S.DELETE_SEGMENT_FINISHED:
            assert cache.segment(m.segment_id).state == target
    else:
        with pytest.raises(IllegalStateTransition):
            cache.apply(update(m, target))
        assert cache.segment(m.segment_id).state == current  # unchanged


@pytest.mark.parametrize("state", [s for s in S if s != S.COPY_SEGMENT_STARTED])
def test_add_only_in_copy_segment_started(state):
    cache = RemoteLogMetadataCache()
    with pytest.raises(IllegalStateTransition):
        cache.apply(segment(TP, 0, 9, [(0, 0)], state=state))
    assert cache.list_segments(TP) == []


def test_duplicate_segment_and_unknown_update():
    cache = RemoteLogMetadataCache()
    m = segment(TP, 0, 9, [(0, 0)])
    cache.apply(m)
    with pytest.raises(DuplicateSegment):
        cache.apply(m)
    with pytest.raises(UnknownSegment):
        cache.apply(update(segment(TP, 0, 9, [(0, 0)]), S.COPY_SEGMENT_FINISHED))


@pytest.mark.parametrize("current, target", list(itertools.product([None, *P], P)))
def test_every_partition_delete_transition(current, target):
    cache = RemoteLogMetadataCache()
    path = {None: [], P.DELETE_PARTITION_MARKED: [P.DELETE_PARTITION_MARKED],
            P.DELETE_PARTITION_STARTED: [P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED],
            P.DELETE_PARTITION_FINISHED: list(P)}[current]
    for state in path:
        cache.apply(RemotePartitionDeleteMetadata(TP, state, 0, 0))
    assert cache.partition_delete_state(TP) == current
    record = RemotePartitionDeleteMetadata(TP, target, 1, 1)
    if (current, target) in LEGAL_PARTITION:
        cache.apply(record)
        assert cache.partition_delete_state(TP) == target
    else:
        with pytest.raises(IllegalStateTransition):
            cache.apply(record)
        assert cache.partition_delete_state(TP) == current


def test_replay_drops_a_broken_record_and_keeps_going():
    cache = RemoteLogMetadataCache()
    m = segment(TP, 0, 9, [(0, 0)])
    assert cache.replay(m)
    assert not cache.replay(update(m, S.DELETE_SEGMENT_FINISHED))
    assert cache.replay(update(m, S.COPY_SEGMENT_FINISHED))
    assert cache.segment(m.segment_id).state == S.COPY_SEGMENT_FINISHED


def test_lookups_follow_state():
    cache = RemoteLogMetadataCache()
    a = segment(TP, 0, 99, [(0, 0), (1, 50)])
    b = segment(TP, 100, 199, [(1, 100), (2, 150)])
    c = segment(TP, 200, 299, [(2, 200)])
    cache.apply(a)
    assert cache.segment_for(TP, 10, 0) is None  # not finished: not served, but listed
    assert cache.list_segments(TP) == [a]
    assert cache.log_start_offset(TP) is None and cache.log_end_offset(TP) is None
    cache.apply(update(a, S.COPY_SEGMENT_FINISHED))
    finished(cache, b), finished(cache, c)
    assert cache.segment_for(TP, 10, 0).segment_id == a.segment_id
    assert cache.segment_for(TP, 60, 0) is None  # offset 60 is epoch 1's
    assert cache.segment_for(TP, 60, 1).segment_id == a.segment_id
    assert cache.segment_for(TP, 120, 1).segment_id == b.segment_id
    assert cache.segment_for(TP, 160, 1) is None
    assert cache.segment_for(TP, 299, 2).segment_id == c.segment_id
    assert cache.segment_for(TP, 300, 2) is None
    assert cache.highest_offset_for_epoch(TP, 0) == 49
    assert cache.highest_offset_for_epoch(TP, 1) == 149
    assert cache.highest_offset_for_epoch(TP, 2) == 299
    assert cache.highest_offset_for_epoch(TP, 3) is None
    assert [m.segment_id for m in cache.list_segments(TP, 1)] == [a.segment_id, b.segment_id]
    assert (cache.log_start_offset(TP), cache.log_end_offset(TP)) == (0, 299)
    cache.apply(update(a, S.DELETE_SEGMENT_STARTED))
    assert cache.segment_for(TP, 10, 0) is None
    assert [m.start_offset for m in cache.list_segments(TP)] == [0, 100, 200]  # still listed for cleanup
    assert cache.log_start_offset(TP) == 100
    assert cache.highest_offset_for_epoch(TP, 0) == 49  # Kafka keeps it
    cache.apply(update(a, S.DELETE_SEGMENT_FINISHED))
    assert [m.start_offset for m in cache.list_segments(TP)] == [100, 200]
    assert cache.list_segments(TP, 0) == []
    other = TopicIdPartition(uuid.uuid4(), "orders", 0)
    assert cache.list_segments(other) == [] and cache.segment_for(other, 0, 0) is None


def test_new_leader_superset_segment_replaces_the_old_ones():
    # Kafka's case-1: L0 uploaded 0-100, L1 (after an election, same epoch) 0-200.
    cache = RemoteLogMetadataCache()
    s0 = finished(cache, segment(TP, 0, 100, [(0, 0)]))
    s1 = finished(cache, segment(TP, 0, 200, [(0, 0)]))
    assert cache.segment_for(TP, 50, 0).segment_id == s1.segment_id
    assert {m.segment_id for m in cache.list_segments(TP, 0)} == {s0.segment_id, s1.segment_id}


def test_a_superset_reaching_as_far_as_the_epoch_replaces_every_segment_it_covers():
    # L0 uploaded 0-49 and 50-99 of epoch 0; L1 (after an election) 0-99 in one segment.
    cache = RemoteLogMetadataCache()
    first = finished(cache, segment(TP, 0, 49, [(0, 0)]))
    second = finished(cache, segment(TP, 50, 99, [(0, 50)]))
    superset = finished(cache, segment(TP, 0, 99, [(0, 0)]))
    assert cache.segment_for(TP, 70, 0).segment_id == superset.segment_id
    assert cache.segment_for(TP, 10, 0).segment_id == superset.segment_id
    assert {m.segment_id for m in cache.list_segments(TP, 0)} == {
        first.segment_id, second.segment_id, superset.segment_id}  # still listed, for cleanup


# Unclean leader election. Broker A led epochs 0 and 1 and tiered offsets 0-199; epoch 1
# (offsets 100-199) was never replicated. Broker B became leader in epoch 2 from offset 100
# and wrote its own 100-249. The current lineage is [(0, 0), (2, 100)].
CHAIN = [(0, 0), (2, 100)]


def unclean_election(cache):
    old = finished(cache, segment(TP, 0, 199, [(0, 0), (1, 100)]))  # diverged tail 100-199
    new_head = finished(cache, segment(TP, 0, 99, [(0, 0)]))  # B re-tiered its own head
    new_tail = finished(cache, segment(TP, 100, 249, [(2, 100)]))
    return old, new_head, new_tail


def test_lineage_check_is_kafkas():
    old = segment(TP, 0, 199, [(0, 0), (1, 100)])
    assert not is_segment_within_lineage(old, CHAIN)
    assert is_segment_within_lineage(segment(TP, 0, 99, [(0, 0)]), CHAIN)
    assert not is_segment_within_lineage(segment(TP, 0, 100, [(0, 0)]), CHAIN)  # runs into epoch 2
    assert is_segment_within_lineage(segment(TP, 100, 249, [(2, 100)]), CHAIN)
    assert not is_segment_within_lineage(segment(TP, 100, 249, [(2, 100)]), CHAIN, log_end_offset=200)
    assert not is_segment_within_lineage(segment(TP, 100, 249, [(3, 100)]), CHAIN)
    # A segment older than the chain's first epoch (log start moved) still matches (Kafka's example).
    chain = [(7, 51), (9, 100)]
    assert is_segment_within_lineage(segment(TP, 14, 150, [(5, 14), (7, 15), (9, 100)]), chain)
    # An epoch without records is ignored on both sides.
    assert is_segment_within_lineage(segment(TP, 0, 99, [(0, 0), (1, 40), (2, 40)]), [(0, 0), (2, 40), (3, 100)])


def test_unclean_election_serves_the_right_lineage():
    cache = RemoteLogMetadataCache()
    old, new_head, new_tail = unclean_election(cache)
    # Kafka's lookup by epoch alone: the diverged segment is the one indexed for epoch 0 at offset 0
    # until B's head replaced it (B's head covers epoch 0 up to 99 just as well).
    assert cache.segment_for(TP, 50, 0, CHAIN).segment_id == new_head.segment_id
    assert cache.segment_for(TP, 150, 2, CHAIN).segment_id == new_tail.segment_id
    assert cache.segment_for(TP, 150, 1, CHAIN) is None  # epoch 1 is not in the lineage
    assert cache.segment_for(TP, 150, 1).segment_id == old.segment_id  # without a chain: Kafka's plain lookup
    assert [m.segment_id for m in cache.segments_in_lineage(TP, CHAIN)] == [new_head.segment_id, new_tail.segment_id]


def test_lineage_filter_when_the_diverged_segment_is_the_only_candidate():
    cache = RemoteLogMetadataCache()
    old = finished(cache, segment(TP, 0, 199, [(0, 0), (1, 100)]))
    assert cache.segment_for(TP, 50, 0).segment_id == old.segment_id
    assert cache.segment_for(TP, 50, 0, CHAIN) is None  # would serve diverged records past 99


def test_truncation_cuts_the_straddling_segment_and_marks_the_rest_for_deletion():
    cache = RemoteLogMetadataCache()
    below = finished(cache, segment(TP, 0, 49, [(0, 0)]))
    old = finished(cache, segment(TP, 50, 199, [(0, 50), (1, 100)]))
    above = finished(cache, segment(TP, 200, 299, [(1, 200)]))
    copying = segment(TP, 300, 399, [(1, 300)])
    cache.apply(copying)
    cache.apply(RemoteLogTruncation(TP, 100, leader_epoch=2, event_timestamp_ms=5))

    assert cache.segment(below.segment_id) == below
    cut = cache.segment(old.segment_id)
    assert (cut.state, cut.end_offset, cut.segment_leader_epochs) == (S.COPY_SEGMENT_FINISHED, 99, ((0, 50),))
    assert cache.segment(above.segment_id).state == S.DELETE_SEGMENT_STARTED
    assert cache.segment(above.segment_id).leader_epoch == 2
    assert cache.segment(copying.segment_id).state == S.DELETE_SEGMENT_STARTED
    assert cache.segment_for(TP, 99, 0).segment_id == old.segment_id
    assert cache.segment_for(TP, 150, 1) is None and cache.segment_for(TP, 250, 1) is None
    assert cache.highest_offset_for_epoch(TP, 0) == 99
    assert cache.highest_offset_for_epoch(TP, 1) is None
    assert cache.log_end_offset(TP) == 99
    # Now within the new lineage, so served with the chain too.
    assert cache.segment_for(TP, 60, 0, CHAIN).segment_id == old.segment_id
    # The new leader's segments after the cut are not touched by it.
    new_tail = finished(cache, segment(TP, 100, 249, [(2, 100)]))
    assert cache.segment_for(TP, 150, 2, CHAIN).segment_id == new_tail.segment_id
    assert cache.log_end_offset(TP) == 249
    assert {m.segment_id for m in cache.list_segments(TP)} == {
        below.segment_id, old.segment_id, above.segment_id, copying.segment_id, new_tail.segment_id}


def test_snapshot_restores_the_same_state():
    cache = RemoteLogMetadataCache()
    unclean_election(cache)
    started = segment(TP, 250, 260, [(2, 250)])
    cache.apply(started)
    cache.apply(RemoteLogTruncation(TP, 150, 3, 0))
    cache.apply(RemotePartitionDeleteMetadata(TP, P.DELETE_PARTITION_MARKED, 0, 0))
    restored = RemoteLogMetadataCache()
    for entry in cache.snapshot(TP):
        restored.restore(entry)
    assert restored.list_segments(TP) == cache.list_segments(TP)
    assert restored.partition_delete_state(TP) == P.DELETE_PARTITION_MARKED
    for offset, epoch in itertools.product(range(0, 260, 10), range(4)):
        assert restored.segment_for(TP, offset, epoch, CHAIN) == cache.segment_for(TP, offset, epoch, CHAIN)
        assert restored.segment_for(TP, offset, epoch) == cache.segment_for(TP, offset, epoch)
