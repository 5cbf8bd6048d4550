"""spark.read.format("tierproxy") against remote segments of data produced to the real broker.

The module produces 50k+ records over 3 partitions (every codec, headers, a committed and
an aborted transaction), tiers the broker's raw log (tests.helpers.tiered), and reads it
back through Spark (local mode, the run's one session).
"""

from __future__ import annotations

import asyncio
import json
import uuid

import javaproperties
import pytest

from tierproxy.pipeline.datasource import (
    EARLIEST,
    LATEST,
    SCHEMA,
    OffsetBounds,
    OptionError,
    ReadOptions,
    parse_offsets,
    plan_slices,
    read_slice,
    register,
)
from tierproxy.protocol.records import ControlType
from tierproxy.config import ConfigError, parse
from tierproxy.client.connection import KafkaConnection
from tierproxy.storage.factory import remote_storage_manager
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tierproxy.storage.model import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tests.helpers.batches import batch, control_batch
from tests.helpers.datasource import expected, read, rows_of
from tests.helpers.metadata import segment
from tests.helpers.remote_tier import tier_log, tier_raw_log, topic_id_of
from tests.helpers.tiered import Mixed, TieredTopic, TopicSpec

PARTITIONS = 3
SEGMENT_BYTES = 150_000
# Every codec, headers, a committed and an aborted transaction: 50k+ records, all of them
# tiered, none trimmed. Partition 0's ABORT marker starts a segment of its own, so the
# aborted records are in a segment whose transaction index does not list them.
SPEC = TopicSpec(Mixed(per_codec=10_000, per_transaction=500, marker_starts_segment=True), partitions=PARTITIONS,
                 fraction=1.0, trim=False, segment_bytes=SEGMENT_BYTES)
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiered(kafka_cluster, own_tiered_topics) -> TieredTopic:
    data = own_tiered_topics(SPEC, kafka_cluster)
    asyncio.run(_add_unfinished(data))
    return data


async def _add_unfinished(tiered: TieredTopic) -> None:
    """Metadata a reader must pass over: a copy still in progress and one being deleted,
    neither with objects in remote storage."""
    assert tiered.root is not None
    async with FileRemoteLogMetadataManager(tiered.root / "metadata") as rlmm:
        tip = tiered.segments[0][0].topic_id_partition
        end = tiered.segments[0][-1].end_offset
        in_progress = segment(tip, end + 1, end + 100)
        deleted = segment(tip, 0, 10)
        for metadata in (in_progress, deleted):
            await rlmm.add_remote_log_segment_metadata(metadata)
        await rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            deleted.segment_id, 0, RemoteLogSegmentState.DELETE_SEGMENT_STARTED, 0))


def _options(tiered: TieredTopic) -> dict[str, str]:
    """The data source's options reading the tiered topic from its store."""
    return {"topic": tiered.topic, **tiered.store}


@pytest.fixture(scope="module")
def tierproxy(spark):
    register(spark)
    return spark


# ----------------------------------------------------------------------------- the fixture itself


def test_data_set_is_tiered_in_several_segments_with_a_split_transaction(tiered):
    assert len(tiered.records) >= 50_000
    assert {r.source for r in tiered.records} >= {"aiokafka-gzip", "aiokafka-snappy", "aiokafka-lz4",
                                                  "aiokafka-zstd", "librdkafka-txn-abort"}
    for partition, segments in tiered.segments.items():
        assert len(segments) >= 3, partition
        for previous, current in zip(segments, segments[1:]):
            assert current.start_offset == previous.end_offset + 1
    aborted = [r.offset for r in tiered.records if r.partition == 0 and not r.committed]
    marker_segment = next(s for s in tiered.segments[0] if s.start_offset == max(aborted) + 1)
    assert not marker_segment.txn_index_empty
    assert all(o < marker_segment.start_offset for o in aborted)


# ----------------------------------------------------------------------------- Spark reads


def test_read_uncommitted_returns_every_data_record(tierproxy, tiered):
    df = read(tierproxy, _options(tiered))
    assert df.schema == SCHEMA
    # Committed and aborted records, byte for byte; no control records.
    assert rows_of(df, tiered.topic) == expected(tiered.records)


def test_read_committed_returns_exactly_the_committed_records(tierproxy, tiered):
    df = read(tierproxy, {**_options(tiered), "isolation.level": "read_committed"})
    committed = [r for r in tiered.records if r.committed]
    assert len(committed) < len(tiered.records)
    assert rows_of(df) == expected(committed)


def test_one_spark_partition_per_finished_segment(tierproxy, tiered):
    df = read(tierproxy, _options(tiered))
    assert df.rdd.getNumPartitions() == sum(len(s) for s in tiered.segments.values())


def test_partitions_and_offsets(tierproxy, tiered):
    options = {
        **_options(tiered),
        "partitions": "0,2",
        "startingOffsets": json.dumps({tiered.topic: {"0": 100, "2": -2}}),
        "endingOffsets": "5000",
    }
    df = read(tierproxy, options)
    ranges = {0: (100, 5000), 2: (0, 5000)}
    want = [r for r in tiered.records if r.partition in ranges and ranges[r.partition][0] <= r.offset < 5000]
    assert rows_of(df) == expected(want)
    overlapping = [s for p, (lo, hi) in ranges.items() for s in tiered.segments[p]
                   if s.end_offset >= lo and s.start_offset < hi]
    assert df.rdd.getNumPartitions() == len(overlapping) < sum(len(s) for s in tiered.segments.values())


def test_offsets_inside_one_segment(tierproxy, tiered):
    segment = tiered.segments[1][1]
    start, end = segment.start_offset + 7, segment.start_offset + 250
    df = read(tierproxy, {**_options(tiered), "partitions": "1", "startingOffsets": str(start),
                          "endingOffsets": json.dumps({tiered.topic: {"1": end}})})
    assert df.rdd.getNumPartitions() == 1
    want = [r for r in tiered.records if r.partition == 1 and start <= r.offset < end]
    assert want and rows_of(df) == expected(want)


def test_earliest_and_latest(tierproxy, tiered):
    assert read(tierproxy, {**_options(tiered), "startingOffsets": "latest"}).count() == 0
    assert read(tierproxy, {**_options(tiered), "endingOffsets": "earliest"}).count() == 0
    df = read(tierproxy, {**_options(tiered), "partitions": "2", "startingOffsets": "earliest",
                          "endingOffsets": "latest"})
    assert df.count() == sum(1 for r in tiered.records if r.partition == 2)


def test_timestamps(tierproxy, tiered):
    timestamps = sorted(r.timestamp_ms for r in tiered.records)
    low, high = timestamps[len(timestamps) // 2], timestamps[3 * len(timestamps) // 4]
    df = read(tierproxy, {**_options(tiered), "startingTimestamp": str(low), "endingTimestamp": str(high)})
    want = [r for r in tiered.records if low <= r.timestamp_ms < high]
    assert rows_of(df) == expected(want)
    # Segments whose newest record is older than startingTimestamp are not read at all.
    candidates = [s for segments in tiered.segments.values() for s in segments if s.max_timestamp_ms >= low]
    assert df.rdd.getNumPartitions() == len(candidates) < sum(len(s) for s in tiered.segments.values())


def test_config_file(tierproxy, tiered, tmp_path):
    path = tmp_path / "tierproxy.properties"
    with open(path, "w", encoding="utf-8") as f:
        javaproperties.dump({
            "bootstrap.servers": tiered.cluster.bootstrap_servers,
            "remote.log.storage.backend": "local",
            "remote.log.storage.local.dir": "/nonexistent",  # overridden by the option below
            "remote.log.metadata.dir": tiered.store["remote.log.metadata.dir"],
        }, f)
    df = read(tierproxy, {"config": str(path), "topic": tiered.topic, "partitions": "1",
                          "remote.log.storage.local.dir": tiered.store["remote.log.storage.local.dir"]})
    assert rows_of(df) == expected(r for r in tiered.records if r.partition == 1)


def test_unknown_topic_is_empty(tierproxy, tiered):
    assert read(tierproxy, {**_options(tiered), "topic": "never-tiered"}).count() == 0


@pytest.mark.parametrize("options, message", [
    ({"isolation.level": "read_most"}, "isolation.level"),
    ({"remote.log.storage.locl.dir": "/x"}, "remote.log.storage.locl.dir"),
    ({"remote.log.metadata.dir": "/nonexistent/metadata"}, "no remote log metadata there"),
])
def test_bad_options_name_the_option(tierproxy, tiered, options, message):
    with pytest.raises(Exception, match=message):
        read(tierproxy, {**_options(tiered), **options}).count()


def test_s3_backend(tierproxy, tiered, kafka_cluster, s3_server, tmp_path):
    config = {
        **s3_server.storage_properties(f"datasource-{uuid.uuid4().hex[:8]}"),
        "remote.log.metadata.dir": str(tmp_path / "metadata"),
    }
    partition = 2

    async def tier() -> list[RemoteLogSegmentMetadata]:
        _, host, port = kafka_cluster.brokers[0]
        async with await KafkaConnection.open(host, port) as conn, \
                remote_storage_manager(parse({"bootstrap.servers": "", **config})) as rsm, \
                FileRemoteLogMetadataManager(tmp_path / "metadata") as rlmm:
            return await tier_raw_log(conn, tiered.topic, partition, rsm=rsm, rlmm=rlmm,
                                      work_dir=tmp_path / "work", segment_bytes=SEGMENT_BYTES)

    segments = asyncio.run(tier())
    df = read(tierproxy, {"topic": tiered.topic, **config, "isolation.level": "read_committed"})
    assert df.rdd.getNumPartitions() == len(segments) > 1
    assert rows_of(df) == expected(r for r in tiered.records if r.partition == partition and r.committed)


# ----------------------------------------------------------------------------- without Spark


def test_offset_options():
    assert parse_offsets("startingOffsets", None, "t", EARLIEST) == OffsetBounds(EARLIEST)
    assert parse_offsets("startingOffsets", " Latest ", "t", EARLIEST) == OffsetBounds(LATEST)
    assert parse_offsets("endingOffsets", "42", "t", LATEST) == OffsetBounds(42)
    bounds = parse_offsets("endingOffsets", '{"t": {"0": 10, "1": -2, "2": -1}}', "t", LATEST)
    assert bounds == OffsetBounds(LATEST, {0: 10, 1: EARLIEST, 2: LATEST})
    # Resolved against a remote log holding [100, 200): clamped, defaults for other partitions.
    assert [bounds.resolve(p, 100, 200) for p in range(4)] == [100, 100, 200, 200]
    assert OffsetBounds(150).resolve(0, 100, 200) == 150
    assert OffsetBounds(500).resolve(0, 100, 200) == 200
    for text, message in [("soon", "startingOffsets"), ("-3", "invalid"), ('{"t": {"0": "x"}}', "not an integer"),
                          ('{"t": 5}', "must look like")]:
        with pytest.raises(OptionError, match=message):
            parse_offsets("startingOffsets", text, "t", EARLIEST)


def test_read_options_and_config():
    options = ReadOptions.parse({"TOPIC": "t", "Partitions": "2, 0", "isolation.level": "READ_COMMITTED",
                                 "startingTimestamp": "1700000000000", "remote.log.storage.local.dir": "/r"})
    assert options.topic == "t" and options.partitions == frozenset({0, 2}) and options.read_committed
    assert options.starting_timestamp == 1_700_000_000_000 and options.ending_timestamp is None
    config = parse(options.config)  # what an executor does
    assert str(config["remote.log.storage.local.dir"]) == "/r" and config["bootstrap.servers"] == ()
    with pytest.raises(ConfigError, match="bootstrap.servers is required"):
        ReadOptions.parse({"topic": "t", "remote.log.metadata.backend": "topic"})
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        ReadOptions.parse({"topic": "t", "config": "/nonexistent/tierproxy.properties"})
    with pytest.raises(OptionError, match="startingTimestamp"):
        ReadOptions.parse({"topic": "t", "startingTimestamp": "yesterday"})
    for options, message in [
        ({"topic": " "}, "topic is required"),
        ({"topic": "t", "isolation.level": "read_most"}, "isolation.level"),
        ({"topic": "t", "partitions": "zero"}, "partitions"),
        ({"topic": "t", "startingOffsets": '{"other": {"0": 1}}'}, "names topics"),
        ({"topic": "t", "endingOffsets": "-5"}, "endingOffsets"),
    ]:
        with pytest.raises(OptionError, match=message):
            ReadOptions.parse(options)
    with pytest.raises(ConfigError, match="unknown configuration key"):
        ReadOptions.parse({"topic": "t", "remote.log.storage.locl.dir": "/x"})


def test_read_committed_stops_before_a_transaction_still_open(tmp_path):
    """Planning and reading without Spark: an open transaction at the end of the remote log
    bounds read_committed, as the last stable offset bounds a Kafka consumer."""
    tip = TopicIdPartition(uuid.uuid4(), "open", 0)
    log = (batch(0, 5) + batch(5, 3, producer_id=7, producer_epoch=0, transactional=True)
           + control_batch(8, ControlType.ABORT, producer_id=7) + batch(9, 4)
           + batch(13, 2, producer_id=8, producer_epoch=0, transactional=True) + batch(15, 2))

    async def tier():
        async with FileRemoteLogMetadataManager(tmp_path / "metadata") as rlmm:
            return await tier_log(log, tip, rsm=LocalRemoteStorageManager(tmp_path / "remote"), rlmm=rlmm,
                                  work_dir=tmp_path / "work", cut_offsets=[8, 10])

    segments = asyncio.run(tier())
    assert [(s.start_offset, s.end_offset) for s in segments] == [(0, 7), (8, 8), (9, 16)]

    def offsets(isolation: str) -> list[int]:
        options = ReadOptions.parse({"topic": "open", "isolation.level": isolation,
                                     "remote.log.storage.local.dir": str(tmp_path / "remote"),
                                     "remote.log.metadata.dir": str(tmp_path / "metadata")})
        out = []
        for piece in asyncio.run(plan_slices(options)):
            for arrow in read_slice(parse(options.config), piece, topic="open"):
                out += arrow.column("offset").to_pylist()
        return out

    # Markers are never rows; the aborted batch's marker is in the next segment.
    assert offsets("read_uncommitted") == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16]
    assert offsets("read_committed") == [0, 1, 2, 3, 4, 9, 10, 11, 12]


async def test_metadata_in_the_topic_backend(kafka_cluster, topic, tmp_path):
    """Planning with remote.log.metadata.backend=topic: the reader waits until the metadata of
    the topic's partitions is read back from __remote_log_metadata."""
    from tierproxy.storage.metadata.topic_store import TopicRemoteLogMetadataManager

    name = topic(partitions=1)
    _, host, port = kafka_cluster.brokers[0]
    async with await KafkaConnection.open(host, port) as conn:
        tip = TopicIdPartition(await topic_id_of(conn, name), name, 0)
    log = batch(0, 5) + batch(5, 5)
    async with TopicRemoteLogMetadataManager(kafka_cluster.bootstrap_servers, directory=tmp_path / "writer") as rlmm:
        segments = await tier_log(log, tip, rsm=LocalRemoteStorageManager(tmp_path / "remote"), rlmm=rlmm,
                                  work_dir=tmp_path / "work", cut_offsets=[5])
    options = ReadOptions.parse({"topic": name, "bootstrap.servers": kafka_cluster.bootstrap_servers,
                                 "remote.log.metadata.backend": "topic",
                                 "remote.log.metadata.dir": str(tmp_path / "reader-unused"),
                                 "remote.log.storage.local.dir": str(tmp_path / "remote")})
    slices = await plan_slices(options)
    assert [(s.segment.segment_id, s.first_offset, s.end_offset) for s in slices] == [
        (segments[0].segment_id, 0, 5), (segments[1].segment_id, 5, 10)]
    # The reader kept what it consumed out of the configured directory.
    assert not (tmp_path / "reader-unused").exists()
