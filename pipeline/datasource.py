"""`spark.read.format("tierproxy")`: a Spark data source over the remote tier's segments.

Reads COPY_SEGMENT_FINISHED segments straight from remote storage, one Spark
partition per segment, with the schema of Spark's own Kafka source:

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int, headers array<struct<key string, value binary>>

Options:
- `topic` (required); `partitions`: "0,2" (default: every partition with remote data).
- `startingOffsets` / `endingOffsets`: "earliest", "latest", an offset for every
  partition, or Spark's JSON `{"topic": {"0": 23}}` (-2 earliest, -1 latest).
  Starting is inclusive, ending exclusive; both are clamped to the remote log.
- `startingTimestamp` / `endingTimestamp` (ms): records with startingTimestamp <=
  timestamp < endingTimestamp. Spark's Kafka source turns a timestamp into an offset
  with ListOffsets; record timestamps need not grow with offsets, so here each record
  is tested. Segments whose max timestamp is below startingTimestamp are not read.
- `isolation.level`: `read_uncommitted` (default) or `read_committed`. Control batches
  are never returned. read_committed leaves out records of aborted transactions and
  stops, as a Kafka read_committed consumer does at the last stable offset, before the
  first transaction still open at the end of the remote log.
- `config`: a tierproxy `.properties` file. Any configuration key given as an option
  (`remote.log.storage.backend`, `remote.log.storage.local.dir`, ...) overrides it.

Both sides read with the remote read side (`remote_log`). The driver walks each
partition's remote log by leader-epoch lineage from its remote log start (every offset
from the segment that serves it, as a consumer through the proxy gets it) and, for
read_committed, collects the aborted transactions from the transaction indexes of the
segments (an aborted transaction's marker may be in a later segment than its data) and
reads the last segment's producer snapshot. Each task reads its slice with the reader's
batch iterator, from the offset index's position, over a chunk cache of a few chunks
with read-ahead (an executor holds little), decodes records with `storage.records` and
hands Spark Arrow record batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import tempfile
from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tierproxy.cache.chunk_cache import ChunkCache
from tierproxy.cache.index_cache import RemoteIndexCache
from tierproxy.config import (
    Config,
    ConfigError,
    parse,
    BOOTSTRAP_SERVERS,
    REMOTE_LOG_CHUNK_SIZE_BYTES,
    REMOTE_LOG_METADATA_BACKEND,
    REMOTE_LOG_METADATA_DIR,
    REMOTE_LOG_READ_AHEAD_CHUNKS,
)
from tierproxy.config.properties import read_properties
from tierproxy.protocol.records import Batch
from tierproxy.pipeline.record_arrays import RecordArrays, batch_arrays
from tierproxy.pipeline.record_arrays import concat as concat_records
from tierproxy.remote_log.reader import RemoteLogReader
from tierproxy.storage.errors import RemoteResourceNotFound, RemoteSegmentNotFound
from tierproxy.storage.factory import remote_log_metadata_manager, remote_storage_manager
from tierproxy.storage.indexes import AbortedTxn, ProducerState
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.metadata.file_store import LOG_FILE_NAME as METADATA_LOG_FILE_NAME
from tierproxy.storage.model import IndexType, RemoteLogSegmentMetadata, TopicIdPartition

NAME = "tierproxy"

SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField("headers", ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))),
    ]
)
# What Spark checks a returned Arrow batch against (its data source worker uses UTC).
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
# `read_slice(..., leader_epoch=True)`: each record's batch's partition leader epoch too (the
# Iceberg tables keep it; Spark's Kafka source schema has no such column).
LEADER_EPOCH = "leaderEpoch"
ARROW_SCHEMA_WITH_LEADER_EPOCH = ARROW_SCHEMA.append(pa.field(LEADER_EPOCH, pa.int32()))

# Spark's Kafka source's JSON offsets: -2 the earliest offset, -1 the latest.
EARLIEST = -2
LATEST = -1
READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"

# Option names are lower case: Spark hands data sources a case-insensitive map with lowered keys.
_OPTIONS = {
    "config",
    "topic",
    "partitions",
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "endingtimestamp",
    "isolation.level",
}
_METADATA_READY_TIMEOUT_S = 60.0
# An Arrow batch handed to Spark: at most this many rows or about this many key + value bytes.
_ARROW_BATCH_ROWS = 8192
_ARROW_BATCH_BYTES = 16 << 20
# A reader's index cache: the indexes of the segments a driver plans or a task reads.
_INDEX_CACHE_BYTES = 16 << 20


class OptionError(ValueError):
    """A data source option is missing or wrong; the message names it."""


# ----------------------------------------------------------------------------- options


@dataclass(frozen=True, slots=True)
class OffsetBounds:
    """startingOffsets / endingOffsets: an offset (or EARLIEST / LATEST) per partition."""

    default: int
    per_partition: Mapping[int, int] = field(default_factory=dict)

    def resolve(self, partition: int, log_start: int, log_end: int) -> int:
        """The bound for `partition` of a remote log holding [log_start, log_end)."""
        offset = self.per_partition.get(partition, self.default)
        if offset == EARLIEST:
            return log_start
        if offset == LATEST:
            return log_end
        return min(max(offset, log_start), log_end)


def parse_offsets(name: str, text: str | None, topic: str, default: int) -> OffsetBounds:
    if text is None:
        return OffsetBounds(default)
    text = text.strip()
    if text.lower() == "earliest":
        return OffsetBounds(EARLIEST)
    if text.lower() == "latest":
        return OffsetBounds(LATEST)
    if text.lstrip("-").isdigit():
        return OffsetBounds(_offset(name, int(text)))
    try:
        parsed = json.loads(text)
    except ValueError:
        raise OptionError(f"{name}={text!r}: must be earliest, latest, an offset or JSON like "
                          f'{{"{topic}": {{"0": 23}}}}') from None
    if not isinstance(parsed, dict) or any(not isinstance(v, dict) for v in parsed.values()):
        raise OptionError(f'{name}={text!r}: JSON offsets must look like {{"{topic}": {{"0": 23}}}}')
    others = sorted(set(parsed) - {topic})
    if others:
        raise OptionError(f"{name}={text!r}: names topics {others}, but the topic read is {topic!r}")
    per_partition = {}
    for partition, offset in parsed.get(topic, {}).items():
        try:
            per_partition[int(partition)] = _offset(name, int(offset))
        except (TypeError, ValueError):
            raise OptionError(f"{name}={text!r}: partition {partition!r} offset {offset!r} is not an integer") from None
    return OffsetBounds(default, per_partition)


def _offset(name: str, offset: int) -> int:
    if offset < EARLIEST:
        raise OptionError(f"{name}: offset {offset} is invalid (-2 earliest, -1 latest, or >= 0)")
    return offset


@dataclass(frozen=True, slots=True)
class ReadOptions:
    topic: str
    partitions: frozenset[int] | None
    starting_offsets: OffsetBounds
    ending_offsets: OffsetBounds
    starting_timestamp: int | None
    ending_timestamp: int | None
    read_committed: bool
    #: The configuration as properties text, parsed again where it is used (executors included).
    config: Mapping[str, str]

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        options = {k.lower(): v for k, v in options.items()}
        topic = (options.get("topic") or "").strip()
        if not topic:
            raise OptionError("option topic is required: the Kafka topic to read")
        partitions = None
        if options.get("partitions", "").strip():
            try:
                partitions = frozenset(int(p) for p in options["partitions"].split(",") if p.strip())
            except ValueError:
                raise OptionError(f"partitions={options['partitions']!r}: must be partition numbers like 0,2") from None
        isolation = options.get("isolation.level", READ_UNCOMMITTED).strip().lower()
        if isolation not in (READ_UNCOMMITTED, READ_COMMITTED):
            raise OptionError(f"isolation.level={isolation!r}: must be {READ_UNCOMMITTED} or {READ_COMMITTED}")
        return cls(
            topic=topic,
            partitions=partitions,
            starting_offsets=parse_offsets("startingOffsets", options.get("startingoffsets"), topic, EARLIEST),
            ending_offsets=parse_offsets("endingOffsets", options.get("endingoffsets"), topic, LATEST),
            starting_timestamp=_timestamp("startingTimestamp", options.get("startingtimestamp")),
            ending_timestamp=_timestamp("endingTimestamp", options.get("endingtimestamp")),
            read_committed=isolation == READ_COMMITTED,
            config=read_config(options).raw(),
        )


def _timestamp(name: str, text: str | None) -> int | None:
    if text is None or not text.strip():
        return None
    try:
        return int(text.strip())
    except ValueError:
        raise OptionError(f"{name}={text!r}: must be a timestamp in milliseconds") from None


def read_config(options: Mapping[str, str]) -> Config:
    """The `config` file with every other non-source option on top, as configuration keys."""
    path = options.get("config")
    properties = read_properties(path) if path else {}
    properties.update({k: v for k, v in options.items() if k not in _OPTIONS})
    # Reading remote segments needs no broker, unless the metadata lives in a topic.
    properties.setdefault("bootstrap.servers", "")
    try:
        config = parse(properties, source=path or "<options>")
    except ConfigError as e:
        raise ConfigError(f"{path or 'options'}: {e}") from None
    if config[REMOTE_LOG_METADATA_BACKEND] == "topic" and not config[BOOTSTRAP_SERVERS]:
        raise ConfigError("bootstrap.servers is required with remote.log.metadata.backend=topic")
    return config


# ----------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class SegmentSlice(InputPartition):
    """One Spark partition: offsets [first_offset, end_offset) of one remote segment."""

    segment: RemoteLogSegmentMetadata
    first_offset: int
    end_offset: int
    #: read_committed: aborted transactions overlapping the slice (empty otherwise).
    aborted: tuple[AbortedTxn, ...] = ()


async def plan_slices(options: ReadOptions) -> list[SegmentSlice]:
    config = parse(options.config)
    with tempfile.TemporaryDirectory(prefix="tierproxy-read-") as scratch:
        async with _metadata_manager(config, scratch) as rlmm:
            if config[REMOTE_LOG_METADATA_BACKEND] == "topic":
                await _wait_for_topic_metadata(rlmm, config, options.topic)
            partitions = await _topic_partitions(rlmm, options)
            async with _reader(config, rlmm) as reader:
                return [piece for tp in partitions for piece in await _partition_slices(reader, tp, options)]


@contextlib.asynccontextmanager
async def _reader(config: Config, rlmm: RemoteLogMetadataManager | None = None) -> AsyncIterator[RemoteLogReader]:
    """A remote log reader with caches of its own, a few chunks with read-ahead (inside the
    event loop that uses it: the S3 client binds to the loop it starts on)."""
    chunk_size, read_ahead = config[REMOTE_LOG_CHUNK_SIZE_BYTES], config[REMOTE_LOG_READ_AHEAD_CHUNKS]
    async with remote_storage_manager(config) as rsm:
        reader = RemoteLogReader(
            rsm, rlmm, RemoteIndexCache(rsm, max_bytes=_INDEX_CACHE_BYTES),
            ChunkCache(rsm, chunk_size=chunk_size, max_bytes=(read_ahead + 1) * chunk_size,
                       read_ahead_chunks=read_ahead))
        try:
            yield reader
        finally:
            await reader.close()


def _metadata_manager(config: Config, scratch: str) -> RemoteLogMetadataManager:
    if config[REMOTE_LOG_METADATA_BACKEND] == "file":
        # A reader never creates the file: a wrong directory would read as "nothing tiered".
        directory = config[REMOTE_LOG_METADATA_DIR]
        if not (directory / METADATA_LOG_FILE_NAME).is_file():
            raise ConfigError(f"remote.log.metadata.dir={str(directory)!r}: no remote log metadata there"
                              f" ({METADATA_LOG_FILE_NAME} is missing)")
    else:
        # The topic backend materializes what it reads into its directory: a reader keeps
        # that private rather than write beside the proxy's or the pipeline's files.
        config = parse({**config.raw(), "remote.log.metadata.dir": scratch})
    return remote_log_metadata_manager(config, read_only=True)


async def _wait_for_topic_metadata(rlmm: RemoteLogMetadataManager, config: Config, topic: str) -> None:
    """The topic backend reads __remote_log_metadata in the background after start: wait
    until it has read what was there for each partition the cluster knows of the topic."""
    from tierproxy.client.cluster import Cluster

    async with Cluster.from_config(config, client_id="tierproxy-read") as cluster:
        info = (await cluster.topics([topic])).get(topic)
    if info is not None:
        for partition in info.partitions:
            await rlmm.wait_until_ready(TopicIdPartition(info.topic_id, topic, partition), _METADATA_READY_TIMEOUT_S)


async def _topic_partitions(rlmm: RemoteLogMetadataManager, options: ReadOptions) -> list[TopicIdPartition]:
    candidates = [
        tp for tp in rlmm.partitions()
        if tp.topic == options.topic and (options.partitions is None or tp.partition in options.partitions)
    ]
    for tp in candidates:
        await rlmm.wait_until_ready(tp, _METADATA_READY_TIMEOUT_S)
    # A topic being removed (or removed) is no longer readable; a topic of the same name
    # created since then is another topic id.
    live = [tp for tp in candidates if rlmm.partition_delete_state(tp) is None]
    ids = {tp.topic_id for tp in live}
    if len(ids) > 1:
        raise OptionError(f"topic {options.topic!r} has remote data under several topic ids: {sorted(map(str, ids))}")
    return sorted(live, key=lambda tp: tp.partition)


async def _partition_slices(reader: RemoteLogReader, tp: TopicIdPartition, options: ReadOptions) -> list[SegmentSlice]:
    """The partition's remote log walked by leader-epoch lineage, cut to the options' bounds."""
    log_start = reader.segments.rlmm.log_start_offset(tp)
    if log_start is None:
        return []
    pieces = list(reader.segments.walk(tp, log_start))
    if not pieces:
        return []
    log_end = pieces[-1][0].end_offset + 1
    start = options.starting_offsets.resolve(tp.partition, log_start, log_end)
    end = options.ending_offsets.resolve(tp.partition, log_start, log_end)
    aborted: list[AbortedTxn] = []
    if options.read_committed:
        undecided = await _first_undecided_offset(reader, pieces[-1][0])
        if undecided is not None:
            end = min(end, undecided)
        if start < end:
            first = next(segment for segment, _ in pieces if segment.end_offset >= start)
            aborted = (await reader.aborted_transactions(first, start, end)).aborted
    slices = []
    for segment, first_offset in pieces:
        low, high = max(first_offset, start), min(segment.end_offset + 1, end)
        if low >= high:
            continue
        if options.starting_timestamp is not None and segment.max_timestamp_ms < options.starting_timestamp:
            continue
        overlapping = tuple(t for t in aborted if t.last_offset >= low and t.first_offset < high)
        slices.append(SegmentSlice(segment, low, high, overlapping))
    return slices


async def _first_undecided_offset(reader: RemoteLogReader, last: RemoteLogSegmentMetadata) -> int | None:
    """First offset of the oldest transaction still open after the last remote segment."""
    try:
        snapshot = await reader.rsm.fetch_index(last, IndexType.PRODUCER_SNAPSHOT)
    except RemoteSegmentNotFound:
        raise  # the segment itself is missing, not only its snapshot
    except RemoteResourceNotFound:
        return None
    return ProducerState.from_snapshot(snapshot).first_undecided_offset


# ----------------------------------------------------------------------------- reading


def read_slice(
    config: Config,
    piece: SegmentSlice,
    *,
    topic: str,
    starting_timestamp: int | None = None,
    ending_timestamp: int | None = None,
    leader_epoch: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The slice's records as Arrow batches, read from the remote segment batch by batch;
    with `leader_epoch`, a last column LEADER_EPOCH (ARROW_SCHEMA_WITH_LEADER_EPOCH)."""
    with asyncio.Runner() as runner:
        arrow = _arrow_batches(config, piece, topic, starting_timestamp, ending_timestamp, leader_epoch)

        async def step() -> pa.RecordBatch | None:
            return await anext(arrow, None)

        try:
            while (batch := runner.run(step())) is not None:
                yield batch
        finally:
            runner.run(arrow.aclose())


async def _arrow_batches(
    config: Config, piece: SegmentSlice, topic: str, starting_timestamp: int | None, ending_timestamp: int | None,
    leader_epoch: bool = False,
) -> AsyncGenerator[pa.RecordBatch, None]:
    rows = _ArrowRows(topic, piece.segment.topic_id_partition.partition, leader_epoch=leader_epoch)
    async with _reader(config) as reader:
        position = await _start_position(reader, piece, starting_timestamp)
        batches = reader.batches(piece.segment, position, from_offset=piece.first_offset)
        async with contextlib.aclosing(batches):
            async for batch, columns in _wanted(batches, piece, starting_timestamp, ending_timestamp):
                rows.add(batch, columns)
                if rows.full:
                    yield rows.flush()
    if rows:
        yield rows.flush()


async def _start_position(reader: RemoteLogReader, piece: SegmentSlice, starting_timestamp: int | None) -> int:
    """A batch boundary at or before the first record the slice needs, from the segment's indexes."""
    segment = piece.segment
    target = piece.first_offset
    if starting_timestamp is not None:
        # An entry (T, o) says every batch up to offset o has timestamps <= T: with
        # T < starting_timestamp, none of them is wanted.
        target = max(target, (await reader.index_cache.time_index(segment)).lookup(starting_timestamp - 1).offset)
    if target <= segment.start_offset:
        return 0
    return (await reader.index_cache.offset_index(segment)).lookup(target).position


async def _wanted(
    batches: AsyncIterator[Batch],
    piece: SegmentSlice,
    starting_timestamp: int | None,
    ending_timestamp: int | None,
) -> AsyncIterator[tuple[Batch, RecordArrays]]:
    """(batch, its wanted records) for each batch with any."""
    first, end = piece.first_offset, piece.end_offset
    aborted: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for txn in piece.aborted:
        aborted[txn.producer_id].append((txn.first_offset, txn.last_offset))
    low = starting_timestamp if starting_timestamp is not None else -(2**63)
    high = ending_timestamp if ending_timestamp is not None else 2**63
    async for batch in batches:
        header = batch.header
        if header.base_offset >= end:
            return
        if header.is_control or header.max_timestamp < low:
            continue
        if header.is_transactional and any(
            f <= header.base_offset <= last for f, last in aborted.get(header.producer_id, ())
        ):
            continue
        records = batch_arrays(batch.view, header)
        keep = []
        if not (first <= header.base_offset and header.last_offset < end):
            keep += [pc.greater_equal(records.offsets, _int64(first)), pc.less(records.offsets, _int64(end))]
        if starting_timestamp is not None:
            keep.append(pc.greater_equal(records.timestamps, _int64(low)))
        if header.max_timestamp >= high:
            keep.append(pc.less(records.timestamps, _int64(high)))
        if keep:
            records = records.filter(functools.reduce(pc.and_, keep))
        if len(records):
            yield batch, records


def _int64(value: int) -> pa.Scalar:
    return pa.scalar(value, pa.int64())


class _ArrowRows:
    """Records gathered into Arrow record batches of at most _ARROW_BATCH_ROWS rows or about
    _ARROW_BATCH_BYTES of keys and values."""

    def __init__(self, topic: str, partition: int, *, leader_epoch: bool = False) -> None:
        self.topic = topic
        self.partition = partition
        self.schema = ARROW_SCHEMA_WITH_LEADER_EPOCH if leader_epoch else ARROW_SCHEMA
        self.leader_epochs: list[int] | None = [] if leader_epoch else None
        self.records: list[RecordArrays] = []
        self.timestamp_types: list[int] = []
        self.rows = self.size = 0

    def __bool__(self) -> bool:
        return bool(self.rows)

    @property
    def full(self) -> bool:
        return self.rows >= _ARROW_BATCH_ROWS or self.size >= _ARROW_BATCH_BYTES

    def add(self, batch: Batch, records: RecordArrays) -> None:
        count = len(records)
        if self.leader_epochs is not None:
            self.leader_epochs.extend([batch.header.partition_leader_epoch] * count)
        self.records.append(records)
        self.timestamp_types.extend([int(batch.header.timestamp_type)] * count)
        self.rows += count
        self.size += records.nbytes

    def flush(self) -> pa.RecordBatch:
        n = self.rows
        records = concat_records(self.records)
        types = [f.type for f in ARROW_SCHEMA]
        columns = [
            records.keys,
            records.values,
            pa.array([self.topic] * n, types[2]),
            pa.array([self.partition] * n, types[3]),
            records.offsets.cast(types[4]),
            pc.multiply(records.timestamps, 1000).cast(types[5]),  # microseconds, as Spark keeps timestamps
            pa.array(self.timestamp_types, types[6]),
            pa.array(records.headers, types[7]),
        ]
        if self.leader_epochs is not None:
            columns.append(pa.array(self.leader_epochs, pa.int32()))
            self.leader_epochs.clear()
        self.records.clear()
        self.timestamp_types.clear()
        self.rows = self.size = 0
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


# ----------------------------------------------------------------------------- Spark


class TierproxyReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return list(asyncio.run(plan_slices(self.options)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SegmentSlice):
            return iter(())  # Spark's placeholder when there is nothing to read
        return read_slice(
            parse(self.options.config),
            partition,
            topic=self.options.topic,
            starting_timestamp=self.options.starting_timestamp,
            ending_timestamp=self.options.ending_timestamp,
        )


class TierproxyDataSource(DataSource):
    """`spark.read.format("tierproxy")`; see the module's documentation for the options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        if schema != SCHEMA:
            raise OptionError(f"the {NAME} source has a fixed schema (Spark's Kafka source): {SCHEMA.simpleString()}")
        return TierproxyReader(ReadOptions.parse(self.options))


def register(spark: SparkSession) -> None:
    """Make `spark.read.format("tierproxy")` available in this session."""
    spark.dataSource.register(TierproxyDataSource)
