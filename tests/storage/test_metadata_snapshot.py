"""The file store's snapshot: a restart loads it, then only the log after it; a snapshot that
is corrupt or not of this log is ignored and the log replayed; the log is read in chunks."""

from __future__ import annotations

import logging
import uuid

import pytest

from tierproxy.storage.errors import RemoteLogMetadataError
from tierproxy.storage.metadata.file_store import (
    LOG_FILE_NAME,
    SNAPSHOT_FILE_NAME,
    FileRemoteLogMetadataManager,
    encode_checked_entry,
    read_entries,
    scan_entries,
)
from tierproxy.storage.metadata.serde import serialize
from tierproxy.storage.metadata.snapshot import LogPosition
from tierproxy.storage.model import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from tests.helpers.metadata_history import TPS, history, segment, state_of, tier

S = RemoteLogSegmentState
ALWAYS = 1  # snapshot_interval_bytes: a snapshot after every append
NEVER = 1 << 40


async def loaded(directory, **kwargs):
    rlmm = FileRemoteLogMetadataManager(directory, read_only=True, **kwargs)
    await rlmm.start()
    return rlmm


async def test_a_restart_loads_the_snapshot_then_only_the_log_after_it(tmp_path):
    async with FileRemoteLogMetadataManager(tmp_path, snapshot_interval_bytes=ALWAYS) as writer:
        await history(writer)
        at_snapshot = state_of(writer)
    assert (tmp_path / SNAPSHOT_FILE_NAME).exists()
    async with FileRemoteLogMetadataManager(tmp_path, snapshot_interval_bytes=NEVER) as writer:
        assert writer.records_replayed_at_start == 0
        assert state_of(writer) == at_snapshot
        # A tail the snapshot is older than.
        await tier(writer, TPS[0], 300, 399, epoch=1)
        await tier(writer, TPS[1], 250, 349, epoch=2)
        expected = state_of(writer)
    reader = await loaded(tmp_path)
    assert reader.records_replayed_at_start == 4
    assert state_of(reader) == expected
    # A reader with no snapshot replays every record and gets the same.
    (tmp_path / SNAPSHOT_FILE_NAME).unlink()
    reader = await loaded(tmp_path)
    assert reader.records_replayed_at_start > 20
    assert state_of(reader) == expected


async def test_a_torn_tail_after_the_snapshot_is_left_to_readers_and_cut_by_writers(tmp_path):
    async with FileRemoteLogMetadataManager(tmp_path, snapshot_interval_bytes=ALWAYS) as writer:
        await history(writer)
        expected = state_of(writer)
    path = tmp_path / LOG_FILE_NAME
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(encode_checked_entry(serialize(segment(TPS[0], 500, 599)))[:-2])
    reader = await loaded(tmp_path)
    assert reader.records_replayed_at_start == 0 and state_of(reader) == expected
    assert path.stat().st_size > size
    async with FileRemoteLogMetadataManager(tmp_path) as writer:
        assert state_of(writer) == expected
        assert path.stat().st_size == size
        await tier(writer, TPS[0], 300, 399)
        expected = state_of(writer)
    assert state_of(await loaded(tmp_path)) == expected


@pytest.mark.parametrize("damage", ["flip a byte", "cut short", "another log", "log shorter than the snapshot"])
async def test_a_snapshot_that_is_not_this_logs_is_ignored(tmp_path, caplog, damage):
    async with FileRemoteLogMetadataManager(tmp_path, snapshot_interval_bytes=ALWAYS) as writer:
        await history(writer)
        expected = state_of(writer)
    snapshot, log_path = tmp_path / SNAPSHOT_FILE_NAME, tmp_path / LOG_FILE_NAME
    data = snapshot.read_bytes()
    if damage == "flip a byte":
        snapshot.write_bytes(data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0x40]) + data[len(data) // 2 + 1:])
    elif damage == "cut short":
        snapshot.write_bytes(data[:-1])
    elif damage == "another log":
        # The same number of bytes, but other entries: the snapshot's last entry is not there.
        other = tmp_path / "other"
        async with FileRemoteLogMetadataManager(other, snapshot_interval_bytes=NEVER) as writer:
            await history(writer)
            expected = state_of(writer)
        log_path.write_bytes((other / LOG_FILE_NAME).read_bytes())
    else:
        entries, _ = scan_entries(log_path.read_bytes())
        kept = b"".join(encode_checked_entry(serialize(r)) for r in entries[:5])
        log_path.write_bytes(kept)
        replayed = tmp_path / "replayed"
        replayed.mkdir()
        (replayed / LOG_FILE_NAME).write_bytes(kept)
        expected = state_of(await loaded(replayed))
    with caplog.at_level(logging.WARNING):
        reader = await loaded(tmp_path)
    assert "is not usable" in caplog.text
    assert reader.records_replayed_at_start > 0
    assert state_of(reader) == expected
    # The next writer writes a good snapshot again.
    async with FileRemoteLogMetadataManager(tmp_path, snapshot_interval_bytes=ALWAYS):
        pass
    caplog.clear()
    reader = await loaded(tmp_path)
    assert reader.records_replayed_at_start == 0 and state_of(reader) == expected
    assert "is not usable" not in caplog.text


async def test_snapshots_follow_the_interval(tmp_path):
    async with FileRemoteLogMetadataManager(tmp_path, snapshot_interval_bytes=NEVER) as writer:
        await history(writer)
    assert not (tmp_path / SNAPSHOT_FILE_NAME).exists()
    size = (tmp_path / LOG_FILE_NAME).stat().st_size
    # A writer that starts behind by more than its interval writes one at once.
    async with FileRemoteLogMetadataManager(tmp_path, snapshot_interval_bytes=size // 2) as writer:
        assert (tmp_path / SNAPSHOT_FILE_NAME).exists()
        stamp = (tmp_path / SNAPSHOT_FILE_NAME).stat().st_mtime_ns
        await tier(writer, TPS[0], 300, 399)  # far less than the interval
        assert (tmp_path / SNAPSHOT_FILE_NAME).stat().st_mtime_ns == stamp
    reader = await loaded(tmp_path)
    assert reader.records_replayed_at_start == 2


def test_the_log_is_read_a_chunk_at_a_time(tmp_path):
    records = [segment(TPS[0], i * 10, i * 10 + 9) for i in range(50)]
    big = RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(TopicIdPartition(uuid.uuid4(), "t" * 200, 0), uuid.uuid4()), start_offset=0,
        end_offset=10_000, max_timestamp_ms=0, leader_epoch=999, event_timestamp_ms=0,
        segment_leader_epochs=tuple((e, e * 10) for e in range(1000)), segment_size_in_bytes=1)
    records.insert(20, big)
    entries = [encode_checked_entry(serialize(r)) for r in records]
    path = tmp_path / LOG_FILE_NAME
    path.write_bytes(b"".join(entries) + entries[0][:-1])  # and a torn tail
    chunk = 4 * len(entries[0]) + 3
    assert len(entries[20]) > chunk
    read, at, calls = [], LogPosition(), 0
    while True:
        got, at = read_entries(path, at, chunk)
        if not got:
            break
        calls += 1
        assert len(got) <= 4 or got == [big]
        read += got
    assert read == records and calls > len(records) // 4
    assert at.position == sum(map(len, entries))
    assert at.last_entry == at.position - len(entries[-1])


async def test_a_manager_for_some_partitions_keeps_only_theirs_and_writes_no_snapshot(tmp_path):
    async with FileRemoteLogMetadataManager(tmp_path, snapshot_interval_bytes=ALWAYS) as writer:
        await history(writer)
    async with FileRemoteLogMetadataManager(tmp_path, snapshot_interval_bytes=NEVER) as writer:
        await tier(writer, TPS[0], 300, 399, epoch=1)  # after the snapshot
        await tier(writer, TPS[1], 250, 349, epoch=2)
        expected = state_of(writer)
    snapshot = (tmp_path / SNAPSHOT_FILE_NAME).read_bytes()
    async with FileRemoteLogMetadataManager(tmp_path, shared=True, partitions=[TPS[0]],
                                            snapshot_interval_bytes=ALWAYS) as task:
        assert task.partitions() == [TPS[0]]
        assert state_of(task, [TPS[0]]) == {TPS[0]: expected[TPS[0]]}
        with pytest.raises(RemoteLogMetadataError, match="keeps only"):
            task.list_segments(TPS[1])
        with pytest.raises(RemoteLogMetadataError, match="keeps only"):
            await task.add_remote_log_segment_metadata(segment(TPS[1], 400, 499))
        added = await tier(task, TPS[0], 400, 499, epoch=1)
    assert (tmp_path / SNAPSHOT_FILE_NAME).read_bytes() == snapshot  # it knows too little to write one
    reader = await loaded(tmp_path)
    assert reader.segment_for(TPS[0], 450, 1).segment_id == added.segment_id
    assert state_of(reader, TPS[1:]) == {tp: expected[tp] for tp in TPS[1:]}
