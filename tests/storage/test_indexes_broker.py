"""Our index files against the ones a real Kafka broker wrote for the same `.log`.

One topic with tiny segments (`internal.segment.bytes`, Kafka's test-only topic
config without the 1 MiB floor of `segment.bytes`) gets data from aiokafka and
confluent-kafka, uncompressed and with every codec, idempotent and
transactional (committed, aborted, interleaved, and one transaction spanning
several segments). Then each rolled segment's `.log` is run through the builder
and every file is compared with the broker's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, Producer, TopicPartition

from tierproxy.protocol.records import iter_batches
from tierproxy.storage.indexes import LeaderEpochCheckpoint, OffsetIndex, ProducerSnapshot, SegmentIndexes, TimeIndex
from tierproxy.storage.indexes import TransactionIndex, build_segment_indexes, epochs_in_range
from tierproxy.storage.indexes import find_offset_by_timestamp, segment_file_name, write_segment_files

pytestmark = pytest.mark.broker

SEGMENT_BYTES = 32 * 1024
# A batch must fit in a segment (else RECORD_LIST_TOO_LARGE); several per segment.
BATCH_BYTES = 8 * 1024
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def _value(i: int) -> bytes:
    # Half random so compressed batches keep a few KiB and segments still roll.
    return os.urandom(60) + b"x" * (i % 200)


async def _produce_aiokafka(bootstrap: str, topic: str) -> None:
    for codec in CODECS:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            compression_type=None if codec == "none" else codec,
            linger_ms=5,
            max_batch_size=BATCH_BYTES,
        )
        await producer.start()
        try:
            futures = [await producer.send(topic, _value(i), key=b"a%d" % i, partition=0) for i in range(150)]
            await producer.flush()
            for future in futures:
                await future
        finally:
            await producer.stop()


def _client(bootstrap: str, **config) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": BATCH_BYTES, **config})


def _send(producer: Producer, topic: str, count: int, tag: bytes) -> None:
    for i in range(count):
        producer.produce(topic, _value(i), key=tag + b"%d" % i, partition=0)
        producer.poll(0)
    assert producer.flush(30) == 0


def _transaction(producer: Producer, topic: str, count: int, tag: bytes, *, commit: bool) -> None:
    producer.begin_transaction()
    _send(producer, topic, count, tag)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def _produce_confluent(bootstrap: str, topic: str) -> None:
    for codec in CODECS:
        _send(_client(bootstrap, **{"compression.type": codec, "enable.idempotence": True}), topic, 150, b"c")

    first = _client(bootstrap, **{"transactional.id": f"{topic}-first", "compression.type": "lz4"})
    second = _client(bootstrap, **{"transactional.id": f"{topic}-second"})
    plain = _client(bootstrap)
    for producer in (first, second):
        producer.init_transactions(30)

    # Committed, then aborted, each alone.
    _transaction(first, topic, 50, b"t1", commit=True)
    _transaction(first, topic, 50, b"t2", commit=False)

    # Interleaved: first aborts while second is open, so the LSO of the abort is
    # second's first offset, not the marker's offset + 1.
    first.begin_transaction()
    _send(first, topic, 30, b"t3")
    second.begin_transaction()
    _send(second, topic, 30, b"u1")
    _send(plain, topic, 20, b"p")
    first.abort_transaction(30)
    _send(second, topic, 30, b"u2")
    second.abort_transaction(30)

    # A transaction across several segments: its ABORT marker's segment must know
    # where it began, from the producer state carried over from earlier segments.
    _transaction(second, topic, 600, b"u3", commit=False)
    _transaction(second, topic, 40, b"u4", commit=True)

    # Enough after the last marker that its segment rolls.
    _send(plain, topic, 300, b"f")


def _rolled_segments(partition_dir: Path) -> list[Path]:
    logs = sorted(partition_dir.glob("*.log"))
    assert len(logs) > 10, f"expected many rolled segments, found {len(logs)}"
    return logs[:-1]  # the active segment's indexes are still preallocated


async def test_index_files_match_the_brokers(kafka_cluster, topic, tmp_path):
    name = topic(config={"internal.segment.bytes": SEGMENT_BYTES})
    bootstrap = kafka_cluster.bootstrap_servers
    await _produce_aiokafka(bootstrap, name)
    _produce_confluent(bootstrap, name)

    partition_dir = kafka_cluster.log_dirs[0] / f"{name}-0"
    broker_epochs = LeaderEpochCheckpoint.parse((partition_dir / "leader-epoch-checkpoint").read_bytes())
    state, epochs = None, ()
    aborted_seen = spanning_seen = interleaved_seen = 0
    codecs_seen: set[int] = set()
    segments: list[SegmentIndexes] = []
    rolled = _rolled_segments(partition_dir)
    for log_path in rolled:
        base = int(log_path.stem)
        ours = build_segment_indexes(
            log_path, base, initial_producer_state=state, initial_leader_epochs=epochs, verify_crc=True
        )
        state, epochs = ours.producer_state, ours.leader_epochs
        segments.append(ours)
        log = log_path.read_bytes()
        codecs_seen |= {h.compression for h in iter_batches(log)}

        _check_offset_index(ours, log, partition_dir)
        _check_time_index(ours, log, partition_dir)
        broker_txn = _read(partition_dir / segment_file_name(base, ".txnindex"))
        assert ours.transaction_index == broker_txn, f"segment {base}: .txnindex differs"
        for txn in TransactionIndex.from_bytes(broker_txn).entries:
            aborted_seen += 1
            spanning_seen += txn.first_offset < base
            interleaved_seen += txn.last_stable_offset != txn.last_offset + 1
        # The broker snapshots producer state when it rolls, named after the next segment.
        broker_snapshot = (partition_dir / segment_file_name(ours.next_offset, ".snapshot")).read_bytes()
        assert ProducerSnapshot.parse(ours.producer_snapshot) == ProducerSnapshot.parse(broker_snapshot)
        assert ours.producer_snapshot == broker_snapshot, f"segment {base}: .snapshot differs"
        # What Kafka's RemoteLogManager ships: the entries up to the segment's end.
        assert list(ours.leader_epochs) == epochs_in_range(broker_epochs.entries, -1, ours.next_offset)
        assert list(ours.segment_leader_epochs) == [
            tuple(e) for e in epochs_in_range(broker_epochs.entries, base, ours.next_offset)
        ]

    assert codecs_seen == {0, 1, 2, 3, 4}
    assert aborted_seen >= 4 and spanning_seen >= 1 and interleaved_seen >= 1
    _check_timestamp_search(bootstrap, name, rolled, segments)

    # The writer lays the same files out under Kafka's names, here for a segment
    # with aborted transactions (its producer state comes from the one before).
    i = next(i for i, s in enumerate(segments) if not s.txn_index_empty)
    data = write_segment_files(
        rolled[i], segments[i].base_offset, tmp_path,
        initial_producer_state=segments[i - 1].producer_state if i else None,
    )
    assert data.transaction_index is not None
    for written in (data.offset_index, data.time_index, data.transaction_index, data.producer_snapshot_index):
        assert written.read_bytes() == (partition_dir / written.name).read_bytes(), written.name


def _read(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def _check_offset_index(ours: SegmentIndexes, log: bytes, partition_dir: Path) -> None:
    base = ours.base_offset
    broker_bytes = (partition_dir / segment_file_name(base, ".index")).read_bytes()
    broker = OffsetIndex.from_bytes(broker_bytes, base)
    mine = OffsetIndex.from_bytes(ours.offset_index, base)
    assert len(broker) > 0, f"segment {base}: broker wrote no offset index entry"
    # Lookups first (what a reader depends on), then the bytes.
    for offset in range(base - 1, ours.next_offset + 1):
        assert mine.lookup(offset) == broker.lookup(offset), f"segment {base}: lookup({offset})"
    batch_starts = {h.position for h in iter_batches(log)}
    assert all(e.position in batch_starts for e in mine.entries)
    assert ours.offset_index == broker_bytes, f"segment {base}: .index differs"


def _check_time_index(ours: SegmentIndexes, log: bytes, partition_dir: Path) -> None:
    base = ours.base_offset
    broker_bytes = (partition_dir / segment_file_name(base, ".timeindex")).read_bytes()
    broker = TimeIndex.from_bytes(broker_bytes, base)
    mine = TimeIndex.from_bytes(ours.time_index, base)
    timestamps = sorted({h.max_timestamp for h in iter_batches(log)})
    for timestamp in [timestamps[0] - 1, *timestamps, timestamps[-1] + 1]:
        assert mine.lookup(timestamp) == broker.lookup(timestamp), f"segment {base}: lookup({timestamp})"
    assert broker.last_entry == (ours.max_timestamp_ms, ours.offset_of_max_timestamp)
    assert ours.time_index == broker_bytes, f"segment {base}: .timeindex differs"


def _check_timestamp_search(bootstrap: str, topic: str, logs: list[Path], segments: list[SegmentIndexes]) -> None:
    """Our batch-level timestamp search brackets the broker's ListOffsets answer."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-ts"})
    checked = 0
    try:
        for log_path, ours in zip(logs, segments):
            log = log_path.read_bytes()
            offset_index = OffsetIndex.from_bytes(ours.offset_index, ours.base_offset)
            time_index = TimeIndex.from_bytes(ours.time_index, ours.base_offset)
            for header in iter_batches(log):
                target = header.max_timestamp
                found = find_offset_by_timestamp(log, target, offset_index=offset_index, time_index=time_index)
                # Earlier segments end below the target, or the broker would answer from them.
                if any(s.max_timestamp_ms >= target for s in segments if s.base_offset < ours.base_offset):
                    continue
                [answer] = consumer.offsets_for_times([TopicPartition(topic, 0, target)], timeout=10)
                assert found is not None
                assert found.batch.base_offset <= answer.offset <= found.batch.last_offset, (target, answer)
                checked += 1
    finally:
        consumer.close()
    assert checked >= 20
