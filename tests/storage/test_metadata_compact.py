"""The compact metadata cache against a straightforward model of Kafka's `RemoteLogMetadataCache`.

The model keeps one RemoteLogSegmentMetadata per segment and, per leader epoch, a dict of
referenced segments by start offset and a list of unreferenced ones, exactly as Kafka's
`RemoteLogLeaderEpochState` does. Random sequences of records (legal and not, applied with
checks or replayed) must give the same answers from both, before and after a compaction and
a snapshot round trip.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import logging
import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierproxy.storage.errors import IllegalStateTransition, RemoteLogMetadataError
from tierproxy.storage.metadata.cache import DuplicateSegment, RemoteLogMetadataCache, UnknownSegment
from tierproxy.storage.metadata.lineage import epoch_end_offset, is_segment_within_lineage
from tierproxy.storage.metadata.serde import RemoteLogTruncation
from tierproxy.storage.metadata.snapshot import decode_partition, encode_partition, section_body
from tierproxy.storage.model import (RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate,
                                     RemoteLogSegmentState, RemotePartitionDeleteMetadata, RemotePartitionDeleteState,
                                     TopicIdPartition, check_partition_delete_transition, check_segment_transition)

S = RemoteLogSegmentState
TPS = [TopicIdPartition(uuid.uuid4(), "orders", 0), TopicIdPartition(uuid.uuid4(), "orders", 1)]
EPOCHS = range(5)
CHAINS = [[(0, 0)], [(0, 0), (2, 100)], [(1, 0)], [(0, 0), (1, 50), (3, 150)], [(2, 0), (4, 200)]]
OFFSETS = range(-1, 400, 7)


# ---------------------------------------------------------------------------- the model


@dataclass
class _Epoch:
    referenced: dict[int, uuid.UUID] = field(default_factory=dict)  # start offset -> segment
    unreferenced: list[uuid.UUID] = field(default_factory=list)  # a set; listed in the order segments were added
    highest: int | None = None


@dataclass
class _Partition:
    segments: dict[uuid.UUID, RemoteLogSegmentMetadata] = field(default_factory=dict)  # in the order added
    epochs: dict[int, _Epoch] = field(default_factory=dict)
    delete: RemotePartitionDeleteMetadata | None = None

    def unreference(self, epoch: int, segment_id: uuid.UUID) -> None:
        state = self.epochs.setdefault(epoch, _Epoch())
        if segment_id not in state.unreferenced:
            state.unreferenced.append(segment_id)

    def drop(self, epoch: int, start: int, segment_id: uuid.UUID) -> None:
        state = self.epochs.get(epoch)
        if state is None:
            return
        if state.referenced.get(start) == segment_id:
            del state.referenced[start]
        if segment_id in state.unreferenced:
            state.unreferenced.remove(segment_id)

    def register(self, m: RemoteLogSegmentMetadata) -> None:
        sid = m.segment_id.id
        for epoch, start in m.segment_leader_epochs:
            state = self.epochs.setdefault(epoch, _Epoch())
            if m.state != S.COPY_SEGMENT_FINISHED:
                self.drop(epoch, start, sid)
                self.unreference(epoch, sid)
                continue
            end = epoch_end_offset(m, epoch)
            while state.referenced and max(state.referenced) >= start and state.highest is not None \
                    and state.highest <= end:
                self.unreference(epoch, state.referenced.pop(max(state.referenced)))
            previous = state.referenced.get(start)
            if previous is not None and previous != sid:
                self.unreference(epoch, previous)
            state.referenced[start] = sid
            if sid in state.unreferenced:
                state.unreferenced.remove(sid)
            state.highest = end if state.highest is None else max(state.highest, end)

    def unregister(self, m: RemoteLogSegmentMetadata) -> None:
        for epoch, start in m.segment_leader_epochs:
            self.drop(epoch, start, m.segment_id.id)

    def epoch_segments(self, epoch: int) -> list[RemoteLogSegmentMetadata]:
        state = self.epochs.get(epoch, _Epoch())
        order = list(self.segments)
        ids = [state.referenced[s] for s in sorted(state.referenced)] + sorted(state.unreferenced, key=order.index)
        return [self.segments[i] for i in ids]


class Model:
    def __init__(self) -> None:
        self.partitions: dict[TopicIdPartition, _Partition] = {}

    def _p(self, tp: TopicIdPartition) -> _Partition:
        return self.partitions.setdefault(tp, _Partition())

    def check(self, record) -> None:
        if isinstance(record, RemoteLogSegmentMetadata):
            if record.state != S.COPY_SEGMENT_STARTED:
                raise IllegalStateTransition("added in another state")
            if record.segment_id.id in self.partitions.get(record.topic_id_partition, _Partition()).segments:
                raise DuplicateSegment("known")
        elif isinstance(record, RemoteLogSegmentMetadataUpdate):
            old = self.partitions.get(record.segment_id.topic_id_partition, _Partition()).segments.get(
                record.segment_id.id)
            if old is None:
                raise UnknownSegment("unknown")
            check_segment_transition(old.state, record.state)
        elif isinstance(record, RemotePartitionDeleteMetadata):
            check_partition_delete_transition(self.delete_state(record.topic_id_partition), record.state)

    def apply(self, record) -> None:
        self.check(record)
        if isinstance(record, RemoteLogSegmentMetadata):
            p = self._p(record.topic_id_partition)
            p.segments[record.segment_id.id] = record
            p.register(record)
        elif isinstance(record, RemoteLogSegmentMetadataUpdate):
            p = self._p(record.segment_id.topic_id_partition)
            self._transition(p, p.segments[record.segment_id.id], record)
        elif isinstance(record, RemotePartitionDeleteMetadata):
            self._p(record.topic_id_partition).delete = record
        else:
            self._truncate(record)

    @staticmethod
    def _transition(p: _Partition, old: RemoteLogSegmentMetadata, update: RemoteLogSegmentMetadataUpdate) -> None:
        new = dataclasses.replace(old, state=update.state, event_timestamp_ms=update.event_timestamp_ms,
                                  leader_epoch=update.leader_epoch)
        if new.state == S.DELETE_SEGMENT_FINISHED:
            p.unregister(old)
            del p.segments[old.segment_id.id]
        else:
            p.segments[old.segment_id.id] = new
            p.register(new)

    def _truncate(self, t: RemoteLogTruncation) -> None:
        p = self._p(t.topic_id_partition)
        cut = t.truncation_offset
        touched: set[int] = set()
        for m in list(p.segments.values()):
            if m.state == S.DELETE_SEGMENT_STARTED or m.end_offset < cut:
                continue
            touched.update(e for e, _ in m.segment_leader_epochs)
            if m.start_offset >= cut:
                self._transition(p, m, RemoteLogSegmentMetadataUpdate(
                    m.segment_id, t.event_timestamp_ms, S.DELETE_SEGMENT_STARTED, t.leader_epoch))
                continue
            kept = tuple((e, o) for e, o in m.segment_leader_epochs if o < cut) or m.segment_leader_epochs[:1]
            for epoch, start in m.segment_leader_epochs[len(kept):]:
                p.drop(epoch, start, m.segment_id.id)
            p.segments[m.segment_id.id] = dataclasses.replace(m, end_offset=cut - 1, segment_leader_epochs=kept)
        for epoch in touched:
            state = p.epochs.get(epoch)
            if state is not None and state.highest is not None and state.highest >= cut:
                state.highest = cut - 1 if state.referenced else None

    # ------------------------------------------------------------------ answers

    def list_segments(self, tp, epoch=None):
        p = self.partitions.get(tp, _Partition())
        segments = list(p.segments.values()) if epoch is None else p.epoch_segments(epoch)
        order = list(p.segments)  # ties in the order segments were added
        return sorted(segments, key=lambda m: (m.start_offset, m.end_offset, order.index(m.segment_id.id)))

    def segment_for(self, tp, offset, epoch, chain=None):
        p = self.partitions.get(tp, _Partition())
        state = p.epochs.get(epoch)
        if state is None:
            return None
        starts = sorted(state.referenced)
        i = bisect.bisect_right(starts, offset)
        if i:
            m = p.segments[state.referenced[starts[i - 1]]]
            if offset <= epoch_end_offset(m, epoch) and (chain is None or is_segment_within_lineage(m, chain)):
                return m
        if chain is None:
            return None
        best = None
        for m in p.epoch_segments(epoch):
            start = dict(m.segment_leader_epochs).get(epoch)
            if m.state == S.COPY_SEGMENT_FINISHED and start is not None \
                    and start <= offset <= epoch_end_offset(m, epoch) and is_segment_within_lineage(m, chain):
                if best is None or m.end_offset > best.end_offset:
                    best = m
        return best

    def highest_offset_for_epoch(self, tp, epoch):
        state = self.partitions.get(tp, _Partition()).epochs.get(epoch)
        return state.highest if state is not None else None

    def delete_state(self, tp):
        d = self.partitions.get(tp, _Partition()).delete
        return d.state if d is not None else None


def answers(cache, tp):
    """Every question the read side and the pipeline ask, for one partition."""
    model = isinstance(cache, Model)
    finished = [m for m in cache.list_segments(tp) if m.state == S.COPY_SEGMENT_FINISHED]
    listed = cache.list_segments(tp)
    return {
        "list": listed,
        "by_epoch": [cache.list_segments(tp, e) for e in EPOCHS],
        "highest": [cache.highest_offset_for_epoch(tp, e) for e in EPOCHS],
        "segment_for": [cache.segment_for(tp, o, e) for o in OFFSETS for e in EPOCHS],
        "in_lineage": [cache.segment_for(tp, o, e, c) for o in OFFSETS[::3] for e in EPOCHS for c in CHAINS],
        "lineage": [[m for m in finished if is_segment_within_lineage(m, c)] for c in CHAINS]
        if model else [cache.segments_in_lineage(tp, c) for c in CHAINS],
        "from": [[m for m in listed if m.end_offset >= o] for o in OFFSETS] if model
        else [list(cache.segments_from(tp, o)) for o in OFFSETS],
        "log_start": min((m.start_offset for m in finished), default=None) if model else cache.log_start_offset(tp),
        "log_end": max((m.end_offset for m in finished), default=None) if model else cache.log_end_offset(tp),
        "delete": cache.delete_state(tp) if model else cache.partition_delete_state(tp),
        "by_id": [m for m in listed] if model else [cache.segment(m.segment_id) for m in listed],
    }


# ---------------------------------------------------------------------------- random records


@st.composite
def segment_records(draw, known):
    tp = draw(st.sampled_from([TPS[0]] * 3 + TPS))
    # Aligned tiles of a few sizes: duplicates, supersets and overlaps come often.
    start = draw(st.integers(0, 15)) * 20
    end = start + draw(st.sampled_from([0, 19, 39, 79]))
    first = draw(st.integers(0, 1))
    epochs = [(first, start)]
    for _ in range(draw(st.integers(0, 2))):
        offset = draw(st.integers(epochs[-1][1], end))
        epochs.append((epochs[-1][0] + draw(st.integers(1, 2)), offset))
    state = draw(st.sampled_from([S.COPY_SEGMENT_STARTED] * 6 + list(S)))
    if known and draw(st.integers(0, 9)) == 0:
        segment_id = draw(st.sampled_from(known))  # a duplicate
    else:
        segment_id = RemoteLogSegmentId(tp, uuid.uuid4())
    known.append(segment_id)
    return RemoteLogSegmentMetadata(
        segment_id=segment_id, start_offset=start, end_offset=end, max_timestamp_ms=draw(st.integers(0, 9)),
        leader_epoch=epochs[-1][0], event_timestamp_ms=1, segment_leader_epochs=tuple(epochs),
        segment_size_in_bytes=draw(st.integers(0, 2**31 - 1)), state=state, txn_index_empty=draw(st.booleans()))


@st.composite
def operations(draw):
    known: list[RemoteLogSegmentId] = []
    ops = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["add"] * 4 + ["update"] * 5 + ["delete", "truncate"]))
        if kind == "add" or not known:
            record = draw(segment_records(known))
        elif kind == "update":
            # Mostly one of the last segments added, so that copies finish.
            segment_id = draw(st.sampled_from(known[-3:] if draw(st.booleans()) else known)) \
                if draw(st.integers(0, 9)) else RemoteLogSegmentId(draw(st.sampled_from(TPS)), uuid.uuid4())
            state = draw(st.sampled_from([S.COPY_SEGMENT_FINISHED] * 4 + list(S)))
            record = RemoteLogSegmentMetadataUpdate(segment_id, draw(st.integers(0, 9)), state, draw(st.integers(0, 5)))
        elif kind == "delete":
            record = RemotePartitionDeleteMetadata(
                draw(st.sampled_from(TPS)), draw(st.sampled_from(list(RemotePartitionDeleteState))), 1, 2)
        else:
            record = RemoteLogTruncation(draw(st.sampled_from(TPS)), draw(st.integers(0, 38)) * 10,
                                         draw(st.integers(0, 5)), 3)
        ops.append((record, draw(st.booleans())))
    return ops


def assert_same(model, cache, *, every_question=True):
    for tp in TPS:
        if every_question:
            assert answers(cache, tp) == answers(model, tp), tp
        else:
            assert cache.list_segments(tp) == model.list_segments(tp), tp
            assert [cache.list_segments(tp, e) for e in EPOCHS] == [model.list_segments(tp, e) for e in EPOCHS], tp
            assert [cache.highest_offset_for_epoch(tp, e) for e in EPOCHS] == [
                model.highest_offset_for_epoch(tp, e) for e in EPOCHS], tp


def round_trip(cache):
    """The cache as a restart would load it from its snapshot sections."""
    restored = RemoteLogMetadataCache()
    for state in cache.partition_states():
        restored.install(decode_partition(section_body(encode_partition(state))))
    return restored


@contextlib.contextmanager
def quiet_replay():
    """Replay logs every record it drops; hundreds of them would only slow the test down."""
    logger = logging.getLogger("tierproxy.storage.metadata.cache")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@given(operations())
@settings(max_examples=200, deadline=None)
def test_compact_cache_answers_like_the_model(ops):
    with quiet_replay():
        run_against_the_model(ops)


def run_against_the_model(ops):
    model, cache = Model(), RemoteLogMetadataCache()
    for step, (record, checked) in enumerate(ops):
        try:
            model.check(record)
            expected = None
        except RemoteLogMetadataError as exc:
            expected = type(exc)
        if checked:
            if expected is None:
                cache.apply(record)
            else:
                with pytest.raises(expected):
                    cache.apply(record)
        else:
            assert cache.replay(record) is (expected is None)
        if expected is None:
            model.apply(record)
        assert_same(model, cache, every_question=step % 4 == 3)
    assert_same(model, round_trip(cache))
    for state in cache.partition_states():
        state.compact()
    assert_same(model, cache)


def test_many_forgotten_segments_are_compacted_away():
    cache, model = RemoteLogMetadataCache(), Model()
    tp = TPS[0]
    for i in range(200):
        m = RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.uuid4()), i * 10, i * 10 + 9, 0, 0, 0,
                                     ((i // 50, i * 10),), 10)
        for record in [m, *(RemoteLogSegmentMetadataUpdate(m.segment_id, 0, s, 0) for s in
                            [S.COPY_SEGMENT_FINISHED] + ([S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED]
                                                         if i % 3 else []))]:
            cache.apply(record)
            model.apply(record)
    state = cache.partition_state(tp)
    assert len(state) == 67
    assert len(state.rows) // 70 < 200  # holes were dropped on the way
    assert_same(model, cache)
