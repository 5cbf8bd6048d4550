"""Kafka's index formats: round trips, lookups against brute force, the one-pass builder."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierproxy.protocol.records import ControlType, iter_batches
from tierproxy.storage.indexes import (
    AbortedTxn,
    CorruptIndexError,
    CorruptLogError,
    EpochEntry,
    LeaderEpochCheckpoint,
    OffsetIndex,
    ProducerSnapshot,
    ProducerState,
    ProducerStateEntry,
    TimeIndex,
    TransactionIndex,
    build_segment_indexes,
    epochs_in_range,
    find_offset_by_timestamp,
    segment_file_name,
    write_segment_files,
)
from tierproxy.storage.indexes.leader_epoch import assign
from tierproxy.storage.indexes.producer_snapshot import java_hash_map_order
from tests.helpers.batches import batch, control_batch

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
base_offsets = st.integers(0, 2**40)


def increasing(draw_from, min_size=0, max_size=40, strict=True):
    """Sorted lists of distinct (strict) or repeated values."""
    values = st.lists(draw_from, min_size=min_size, max_size=max_size, unique=strict)
    return values.map(sorted)


# -- offset index -----------------------------------------------------------------


@st.composite
def offset_entries(draw):
    relatives = draw(increasing(st.integers(0, 2**31 - 1)))
    positions = draw(increasing(st.integers(0, 2**31 - 1), min_size=len(relatives), max_size=len(relatives)))
    return list(zip(relatives, positions))


@given(offset_entries(), base_offsets)
@FAST
def test_offset_index_round_trip(entries, base):
    absolute = [(base + r, p) for r, p in entries]
    index = OffsetIndex.from_entries(absolute, base)
    assert index.to_bytes() == b"".join(struct.pack(">ii", r, p) for r, p in entries)
    again = OffsetIndex.from_bytes(index.to_bytes(), base)
    assert again == index and [tuple(e) for e in again.entries] == absolute and len(again) == len(entries)


@given(offset_entries(), base_offsets, st.data())
@FAST
def test_offset_lookup_is_largest_entry_at_or_below(entries, base, data):
    index = OffsetIndex.from_entries([(base + r, p) for r, p in entries], base)
    for _ in range(20):
        target = base + data.draw(st.integers(-5, 2**31 + 5))
        below = [(base + r, p) for r, p in entries if base + r <= target]
        assert index.lookup(target) == (below[-1] if below else (base, 0))


# -- time index -------------------------------------------------------------------


@st.composite
def time_entries(draw):
    timestamps = draw(increasing(st.integers(0, 2**62)))
    relatives = draw(increasing(st.integers(0, 2**31 - 1), min_size=len(timestamps), max_size=len(timestamps)))
    return list(zip(timestamps, relatives))


@given(time_entries(), base_offsets, st.data())
@FAST
def test_time_index_round_trip_and_lookup(entries, base, data):
    absolute = [(t, base + r) for t, r in entries]
    index = TimeIndex.from_bytes(TimeIndex.from_entries(absolute, base).to_bytes(), base)
    assert [tuple(e) for e in index.entries] == absolute
    assert index.last_entry == (absolute[-1] if absolute else (-1, base))
    for _ in range(20):
        target = data.draw(st.integers(-3, 2**62 + 3))
        below = [e for e in absolute if e[0] <= target]
        assert index.lookup(target) == (below[-1] if below else (-1, base))


# -- transaction index ------------------------------------------------------------


@st.composite
def aborted_txns(draw):
    lasts = draw(increasing(st.integers(0, 10_000), max_size=25))
    txns = []
    for last in lasts:
        first = draw(st.integers(0, last))
        lso = draw(st.integers(first, 10_010))
        txns.append(AbortedTxn(draw(st.integers(0, 2**63 - 1)), first, last, lso))
    return txns


@given(aborted_txns(), st.integers(-1, 10_010), st.integers(0, 10_020))
@FAST
def test_transaction_index_round_trip_and_collect(txns, fetch_offset, upper_bound):
    data = TransactionIndex.from_entries(txns).to_bytes()
    assert len(data) == 34 * len(txns)
    index = TransactionIndex.from_bytes(data)
    assert list(index.entries) == txns
    # Kafka's collectAbortedTxns, written out longhand.
    expected, complete = [], False
    for txn in txns:
        if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound:
            expected.append(txn)
        if txn.last_stable_offset >= upper_bound:
            complete = True
            break
    assert index.collect_aborted(fetch_offset, upper_bound) == (expected, complete)


def test_transaction_entry_layout_is_kafkas():
    entry = AbortedTxn(producer_id=7, first_offset=100, last_offset=150, last_stable_offset=151)
    assert entry.pack() == bytes.fromhex("0000" + "0000000000000007" + "0000000000000064" + "0000000000000096"
                                         + "0000000000000097")


# -- leader epoch checkpoint ------------------------------------------------------


@st.composite
def epoch_entries(draw):
    epochs = draw(increasing(st.integers(0, 2**31 - 1), max_size=15))
    offsets = draw(increasing(st.integers(0, 2**63 - 2), min_size=len(epochs), max_size=len(epochs), strict=False))
    return [EpochEntry(e, o) for e, o in zip(epochs, offsets)]


@given(epoch_entries())
@FAST
def test_leader_epoch_checkpoint_round_trip(entries):
    text = LeaderEpochCheckpoint(entries).serialize()
    assert text.decode().splitlines()[:2] == ["0", str(len(entries))]
    assert LeaderEpochCheckpoint.parse(text).entries == tuple(entries)


def test_leader_epoch_checkpoint_reads_kafkas_text():
    checkpoint = LeaderEpochCheckpoint.parse(b"0\n3\n0 0\n2  150\n5\t9000\n")
    assert checkpoint.entries == ((0, 0), (2, 150), (5, 9000))
    assert checkpoint.serialize() == b"0\n3\n0 0\n2 150\n5 9000\n"
    assert LeaderEpochCheckpoint.parse(b"").entries == () == LeaderEpochCheckpoint.parse(b"0\n").entries


@given(epoch_entries(), st.data())
@FAST
def test_epochs_in_range_matches_brute_force(entries, data):
    near = st.sampled_from([-1, 0, *[e.start_offset + d for e in entries for d in (-1, 0, 1)]])
    start, end = data.draw(near), data.draw(near)
    # Per offset the epoch in force, then the range's entries from that: Kafka's
    # epochEntriesInRange, stated without its truncation steps.
    result = epochs_in_range(entries, start, end)
    kept = [e for e in entries if (end < 0 or e.start_offset < end) and (start < 0 or e.start_offset > start)]
    in_force = [e for e in entries if 0 <= start and e.start_offset <= start]
    if in_force and (end < 0 or start < end):
        kept.insert(0, EpochEntry(in_force[-1].epoch, start))
    assert result == kept


def test_assign_follows_kafkas_leader_epoch_cache():
    entries: list[EpochEntry] = []
    assert assign(entries, 0, 0) and not assign(entries, 0, 5)
    assert assign(entries, 3, 10) and entries == [(0, 0), (3, 10)]
    # A lower epoch, or an earlier start, truncates what conflicts with it.
    assert assign(entries, 2, 8) and entries == [(0, 0), (2, 8)]
    assert assign(entries, 4, 0) and entries == [(4, 0)]


# -- producer snapshot ------------------------------------------------------------

producer_entries = st.builds(
    ProducerStateEntry,
    producer_id=st.integers(0, 2**63 - 1),
    producer_epoch=st.integers(-1, 2**15 - 1),
    last_sequence=st.integers(-1, 2**31 - 1),
    last_offset=st.integers(-1, 2**63 - 1),
    offset_delta=st.integers(0, 2**31 - 1),
    timestamp=st.integers(-1, 2**63 - 1),
    coordinator_epoch=st.integers(-1, 2**31 - 1),
    current_txn_first_offset=st.integers(-1, 2**63 - 1),
)


@given(st.lists(producer_entries, max_size=20))
@FAST
def test_producer_snapshot_round_trip(entries):
    data = ProducerSnapshot(entries).serialize()
    assert len(data) == 10 + 46 * len(entries)
    assert ProducerSnapshot.parse(data).entries == tuple(entries)


def test_producer_snapshot_layout_is_kafkas():
    entry = ProducerStateEntry(5, 1, 9, 100, 9, 1_700_000_000_000, 3, -1)
    data = ProducerSnapshot([entry]).serialize()
    assert data[:2] == b"\x00\x01" and data[6:10] == b"\x00\x00\x00\x01"
    assert data[10:] == struct.pack(">qhiqiqiq", *entry)


def test_java_hash_map_order():
    # Small ids land in bucket id % capacity; ids that share a bucket keep insertion order.
    assert java_hash_map_order([3, 1, 2, 0]) == [0, 1, 2, 3]
    assert java_hash_map_order([17, 1, 16, 0]) == [16, 0, 17, 1]  # capacity 16: 16 -> bucket 0
    assert java_hash_map_order(list(range(13))[::-1]) == list(range(13))  # 13 > 12: capacity 32
    assert java_hash_map_order([2, 2**32]) == [2**32, 2]  # Long.hashCode(2^32) == 1


# -- corrupt files ----------------------------------------------------------------


def _loaders():
    return [
        lambda b: OffsetIndex.from_bytes(b, 0),
        lambda b: TimeIndex.from_bytes(b, 0),
        TransactionIndex.from_bytes,
        LeaderEpochCheckpoint.parse,
        ProducerSnapshot.parse,
    ]


@given(st.binary(max_size=200))
@settings(max_examples=150, deadline=None)
def test_garbage_raises_only_corrupt_index_error(data):
    for load in _loaders():
        try:
            load(data)
        except CorruptIndexError:
            pass


@given(st.data())
@FAST
def test_truncated_files_are_refused(data):
    files = [
        (OffsetIndex.from_entries([(10, 0), (20, 5000), (35, 9000)], 0).to_bytes(), _loaders()[0], 8),
        (TimeIndex.from_entries([(1000, 10), (2000, 20)], 0).to_bytes(), _loaders()[1], 12),
        (TransactionIndex.from_entries([AbortedTxn(1, 0, 10, 11)]).to_bytes(), _loaders()[2], 34),
        (ProducerSnapshot([ProducerStateEntry(1)]).serialize(), _loaders()[4], None),
    ]
    # (The leader-epoch checkpoint is text without a checksum: cut after a line, or
    # inside the last number, it still parses, in Kafka's reader too.)
    for blob, load, entry_size in files:
        cut = data.draw(st.integers(1, len(blob) - 1))
        if entry_size and cut % entry_size == 0:
            continue  # a whole number of entries is a valid, shorter index
        with pytest.raises(CorruptIndexError):
            load(blob[:cut])


def test_out_of_order_entries_are_refused():
    with pytest.raises(CorruptIndexError):
        OffsetIndex.from_bytes(struct.pack(">iiii", 10, 100, 5, 200), 0)
    with pytest.raises(CorruptIndexError):
        OffsetIndex.from_bytes(struct.pack(">ii", -1, 0), 0)
    with pytest.raises(CorruptIndexError):
        TimeIndex.from_bytes(struct.pack(">qiqi", 2000, 1, 1000, 2), 0)
    with pytest.raises(CorruptIndexError):
        TransactionIndex.from_entries([AbortedTxn(1, 0, 10, 11), AbortedTxn(2, 0, 10, 11)])
    with pytest.raises(CorruptIndexError):
        LeaderEpochCheckpoint.parse(b"0\n2\n3 0\n1 5\n")
    with pytest.raises(CorruptIndexError):
        LeaderEpochCheckpoint.parse(b"0\n3\n0 0\n")
    with pytest.raises(CorruptIndexError):
        LeaderEpochCheckpoint.parse(b"1\n0\n")
    snapshot = bytearray(ProducerSnapshot([ProducerStateEntry(1, 0)]).serialize())
    snapshot[-1] ^= 1
    with pytest.raises(CorruptIndexError, match="CRC"):
        ProducerSnapshot.parse(bytes(snapshot))


def test_preallocated_index_is_trimmed():
    entries = OffsetIndex.from_entries([(7, 4100), (9, 8200)], 5).to_bytes()
    index = OffsetIndex.from_bytes(entries + bytes(8 * 100 + 3), 5, preallocated=True)
    assert index.entries == [(7, 4100), (9, 8200)]
    with pytest.raises(CorruptIndexError):
        OffsetIndex.from_bytes(entries + bytes(16), 5)


# -- the builder ------------------------------------------------------------------

# One batch: (records, value size, timestamp step, leader epoch step)
batch_plans = st.lists(
    st.tuples(st.integers(1, 12), st.integers(0, 1500), st.integers(-50, 200), st.sampled_from([0, 0, 0, 1, 3])),
    min_size=1,
    max_size=30,
)


def _plain_log(plan, base_offset, start_timestamp=1_700_000_000_000):
    parts, offset, timestamp, epoch = [], base_offset, start_timestamp, 0
    for count, value_size, step, epoch_step in plan:
        timestamp += step
        epoch += epoch_step
        parts.append(batch(offset, count, value_size=value_size, timestamp_ms=timestamp, leader_epoch=epoch))
        offset += count
    return b"".join(parts)


def _kafka_index_rule(headers, base, interval):
    """The entries LogSegment.recover writes, stated per batch."""
    offsets, times, last_entry, max_ts, max_off, last_ts = [], [], 0, -1, base, -1
    for h in headers:
        if h.max_timestamp > max_ts:
            max_ts, max_off = h.max_timestamp, h.last_offset
        if h.position - last_entry > interval:
            offsets.append((h.last_offset, h.position))
            if max_ts > last_ts:
                times.append((max_ts, max_off))
                last_ts = max_ts
            last_entry = h.position
    if max_ts > last_ts:
        times.append((max_ts, max_off))
    return offsets, times


@given(batch_plans, base_offsets, st.sampled_from([0, 100, 4096, 10_000]), st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_builder_indexes_follow_kafkas_rule_and_find_every_offset(plan, base, interval, data):
    log = _plain_log(plan, base)
    built = build_segment_indexes(log, base, index_interval_bytes=interval)
    headers = list(iter_batches(log))
    offsets, times = _kafka_index_rule(headers, base, interval)
    offset_index = OffsetIndex.from_bytes(built.offset_index, base)
    time_index = TimeIndex.from_bytes(built.time_index, base)
    assert [tuple(e) for e in offset_index.entries] == offsets
    assert [tuple(e) for e in time_index.entries] == times

    # Every offset is reached by scanning forward from its lookup position.
    for h in headers:
        for offset in (h.base_offset, h.last_offset):
            start = offset_index.lookup(offset).position
            assert start <= h.position and start in {x.position for x in headers}
    # The timestamp search finds the first batch reaching the target, as a full scan does.
    for _ in range(10):
        target = data.draw(st.integers(headers[0].max_timestamp - 300, max(h.max_timestamp for h in headers) + 5))
        expected = next((h for h in headers if h.max_timestamp >= target), None)
        found = find_offset_by_timestamp(log, target, offset_index=offset_index, time_index=time_index)
        assert (found and found.batch.base_offset) == (expected and expected.base_offset)

    assert (built.base_offset, built.end_offset, built.size_in_bytes) == (base, headers[-1].last_offset, len(log))
    assert built.max_timestamp_ms == max(h.max_timestamp for h in headers)
    epochs = [h.partition_leader_epoch for h in headers]
    assert (built.first_leader_epoch, built.last_leader_epoch) == (epochs[0], epochs[-1])
    firsts = [(h.partition_leader_epoch, h.base_offset) for i, h in enumerate(headers)
              if i == 0 or h.partition_leader_epoch != headers[i - 1].partition_leader_epoch]
    assert list(built.segment_leader_epochs) == firsts
    assert LeaderEpochCheckpoint.parse(built.leader_epoch_checkpoint).entries == tuple(firsts)
    assert built.txn_index_empty and ProducerSnapshot.parse(built.producer_snapshot).entries == ()


@given(batch_plans, st.integers(61, 5000))
@settings(max_examples=25, deadline=None)
def test_builder_reads_files_in_chunks_like_bytes(tmp_path_factory, plan, chunk):
    log = _plain_log(plan, 1000)
    path = tmp_path_factory.mktemp("log") / segment_file_name(1000, ".log")
    path.write_bytes(log)
    from_file = build_segment_indexes(path, 1000, chunk_bytes=chunk, verify_crc=True)
    assert from_file == build_segment_indexes(log, 1000)


def test_corrupt_log_raises_corrupt_log_error(tmp_path):
    log = _plain_log([(3, 100, 1, 0), (2, 50, 1, 0)], 0)
    for bad in (log[:-1], log + b"\x00" * 5, b"\xff" * 80, log[:20]):
        with pytest.raises(CorruptLogError):
            build_segment_indexes(bad, 0)
        (tmp_path / "bad.log").write_bytes(bad)
        with pytest.raises(CorruptLogError):
            build_segment_indexes(tmp_path / "bad.log", 0, chunk_bytes=64)
    with pytest.raises(CorruptLogError):
        build_segment_indexes(log, 1)  # a batch below the segment's base offset
    flipped = bytearray(log)
    flipped[70] ^= 0xFF
    with pytest.raises(CorruptLogError, match="CRC"):
        build_segment_indexes(bytes(flipped), 0, verify_crc=True)


# -- transactions -----------------------------------------------------------------


def _txn_log(ops, base_offset=0):
    """ops: (producer id or -1, 'data' | 'txn' | COMMIT | ABORT, records). Returns bytes and markers."""
    parts, offset = [], base_offset
    for pid, kind, count in ops:
        if kind in (ControlType.COMMIT, ControlType.ABORT):
            parts.append(control_batch(offset, kind, producer_id=pid))
            offset += 1
        else:
            parts.append(batch(offset, count, producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                               transactional=kind == "txn"))
            offset += count
    return b"".join(parts), offset


def _reference_aborts(ops, base_offset=0, open_txns=None):
    """The aborted-transaction entries, computed the simplest way."""
    open_txns, offset, aborted = dict(open_txns or {}), base_offset, []
    for pid, kind, count in ops:
        if kind in (ControlType.COMMIT, ControlType.ABORT):
            if pid in open_txns:
                first = open_txns.pop(pid)
                if kind is ControlType.ABORT:
                    lso = min(open_txns.values(), default=offset + 1)
                    aborted.append(AbortedTxn(pid, first, offset, lso))
            offset += 1
        else:
            if kind == "txn":
                open_txns.setdefault(pid, offset)
            offset += count
    return aborted, open_txns


@st.composite
def txn_ops(draw):
    ops, open_pids = [], set()
    for _ in range(draw(st.integers(1, 40))):
        pid = draw(st.sampled_from([-1, 1, 2, 3, 70_000]))
        if pid < 0:
            ops.append((pid, "data", draw(st.integers(1, 5))))
        elif pid in open_pids:
            kind = draw(st.sampled_from(["txn", ControlType.COMMIT, ControlType.ABORT]))
            ops.append((pid, kind, draw(st.integers(1, 5))))
            if kind != "txn":
                open_pids.discard(pid)
        else:
            kind = draw(st.sampled_from(["txn", "data", ControlType.ABORT]))  # a marker without data is legal
            ops.append((pid, kind, draw(st.integers(1, 5))))
            if kind == "txn":
                open_pids.add(pid)
    return ops


@given(txn_ops(), st.data())
@settings(max_examples=60, deadline=None)
def test_transaction_index_matches_reference_across_segments(ops, data):
    cut = data.draw(st.integers(0, len(ops)))
    first_ops, second_ops = ops[:cut], ops[cut:]
    expected_first, still_open = _reference_aborts(first_ops)
    first_log, second_base = _txn_log(first_ops)
    expected_second, _ = _reference_aborts(second_ops, second_base, still_open)
    second_log, _ = _txn_log(second_ops, second_base)

    state = None
    if first_ops:
        first = build_segment_indexes(first_log, 0)
        assert TransactionIndex.from_bytes(first.transaction_index).entries == tuple(expected_first)
        assert first.producer_state.ongoing_transactions == dict(sorted(still_open.items(), key=lambda kv: kv[1]))
        state = first.producer_state
    if second_ops:
        # The state may come from the previous build, its snapshot file, or a plain map.
        for initial in (state, state and ProducerState.from_snapshot(first.producer_snapshot), still_open):
            second = build_segment_indexes(second_log, second_base, initial_producer_state=initial)
            assert TransactionIndex.from_bytes(second.transaction_index).entries == tuple(expected_second)
            assert second.txn_index_empty == (not expected_second)


def test_abort_while_another_transaction_is_open_has_that_transactions_lso():
    ops = [(1, "txn", 3), (2, "txn", 2), (-1, "data", 4), (1, "txn", 1), (1, ControlType.ABORT, 0),
           (2, ControlType.ABORT, 0)]
    log, _ = _txn_log(ops)
    built = build_segment_indexes(log, 0)
    assert TransactionIndex.from_bytes(built.transaction_index).entries == (
        AbortedTxn(1, 0, 10, 3),  # producer 2's transaction, open since offset 3, holds the LSO
        AbortedTxn(2, 3, 11, 12),
    )


def test_transaction_spanning_segments_needs_the_earlier_state():
    log_a, next_offset = _txn_log([(9, "txn", 5), (-1, "data", 5)])
    log_b, _ = _txn_log([(9, "txn", 2), (9, ControlType.ABORT, 0)], next_offset)
    a = build_segment_indexes(log_a, 0)
    assert a.producer_state.ongoing_transactions == {9: 0}
    with_state = build_segment_indexes(log_b, next_offset, initial_producer_state=a.producer_state)
    assert TransactionIndex.from_bytes(with_state.transaction_index).entries == (AbortedTxn(9, 0, 12, 13),)
    # Without it, the transaction seems to begin inside this segment, as Kafka's
    # recovery would see it had it lost the earlier snapshot.
    alone = build_segment_indexes(log_b, next_offset)
    assert TransactionIndex.from_bytes(alone.transaction_index).entries == (AbortedTxn(9, 10, 12, 13),)
    snapshot = ProducerSnapshot.parse(with_state.producer_snapshot).entries
    assert [(e.producer_id, e.coordinator_epoch, e.current_txn_first_offset, e.last_offset) for e in snapshot] == [
        (9, 0, -1, 11)
    ]


def test_producer_state_matches_kafkas_entry_rules():
    log, _ = _txn_log([(4, "data", 3), (4, "data", 2)])
    [entry] = ProducerSnapshot.parse(build_segment_indexes(log, 0).producer_snapshot).entries
    # helpers.batch gives every batch base sequence 0: the last sequence is its last offset delta.
    assert entry == ProducerStateEntry(4, 0, 1, 4, 1, entry.timestamp, -1, -1)
    bumped = batch(5, 1, producer_id=4, producer_epoch=1) + control_batch(6, ControlType.COMMIT, producer_id=4,
                                                                           producer_epoch=2)
    state = build_segment_indexes(bumped, 5, initial_producer_state=build_segment_indexes(log, 0).producer_state)
    [entry] = ProducerSnapshot.parse(state.producer_snapshot).entries
    # A marker with a new epoch (transactions v2) drops the batch metadata.
    assert (entry.producer_epoch, entry.last_sequence, entry.last_offset, entry.offset_delta) == (2, -1, -1, 0)


# -- writing files ----------------------------------------------------------------


def test_write_segment_files_uses_kafkas_names(tmp_path: Path):
    log, next_offset = _txn_log([(3, "txn", 400), (3, ControlType.ABORT, 0), (-1, "data", 300)], 1200)
    log_path = tmp_path / segment_file_name(1200, ".log")
    log_path.write_bytes(log)
    out = tmp_path / "out"
    data = write_segment_files(log_path, 1200, out)
    assert data.log_segment == log_path
    assert data.offset_index.name == "00000000000000001200.index"
    assert data.time_index.name == "00000000000000001200.timeindex"
    assert data.transaction_index is not None and data.transaction_index.name == "00000000000000001200.txnindex"
    assert data.producer_snapshot_index.name == f"{next_offset:020d}.snapshot"
    built = build_segment_indexes(log_path, 1200)
    assert data.offset_index.read_bytes() == built.offset_index and len(built.offset_index) > 0
    assert data.transaction_index.read_bytes() == built.transaction_index
    assert data.leader_epoch_index == b"0\n1\n0 1200\n"
    assert not list(out.glob("*.tmp"))
    with pytest.raises(FileExistsError):
        write_segment_files(log_path, 1200, out)
    assert write_segment_files(log_path, 1200, out, overwrite=True) == data

    plain = tmp_path / segment_file_name(0, ".log")
    plain.write_bytes(_plain_log([(2, 10, 1, 0)], 0))
    assert write_segment_files(plain, 0, out).transaction_index is None
