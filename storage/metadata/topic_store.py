"""TopicRemoteLogMetadataManager: remote log metadata in the `__remote_log_metadata` topic.

After Kafka's `TopicBasedRemoteLogMetadataManager` and seed 003:

- The topic is created when missing: `num_partitions` (Kafka's
  `remote.log.metadata.topic.num.partitions`, 50), replication min(3, brokers) unless given,
  `retention.ms=-1`, `cleanup.policy=delete`. An existing topic with another partition
  count is an error: the partitioner below would send records where other readers do not look.
- Records are Kafka's (`serde.py`), null key, produced with acks=all and idempotence to
  metadata partition `metadata_partition(tp, num_partitions)`, Kafka's
  `RemoteLogMetadataTopicPartitioner`, so every record of a user partition is in one
  metadata partition, in order.
- One consumer is assigned every metadata partition (the proxy serves all partitions).
  Records are replayed into the cache (a record breaking a rule is dropped with a log
  line, as Kafka's consumer does, so every instance converges).
- Materialized state, per user partition, in `<directory>/<topic>-<partition>-<topic id hex>.metadata`:

      magic                  int8, 1
      topic id               16 bytes
      metadata topic offset  int64 big-endian: the last offset of the metadata partition
                             reflected in this file
      state                  the partition's whole state, one `snapshot.py` section: a
                             restart loads it with a few array copies, whatever its size

  (Magic 0 files, seed 003's format written before, hold instead one length-prefixed record
  per segment not DELETE_SEGMENT_FINISHED and the delete state; they are still read.)
  Files are rewritten (temp file, fsync, rename) after each consumed batch that touched the
  partition, then `<directory>/committed_offsets` (Kafka checkpoint text: version, count,
  "<metadata partition> <offset>" lines) records how far each metadata partition was read.
  While the topic is read from far behind (a first start), they are written only every
  `PERSIST_EVERY_RECORDS` records or `PERSIST_EVERY_S` seconds and once caught up.
  A restart loads the files and resumes each metadata partition after its committed offset;
  a record at or below its partition file's offset is skipped (a crash between the two
  renames), so nothing is applied twice. A file that does not decode is set aside with a
  warning and its metadata partition is read again from the beginning.
- A write returns once this instance's consumer has read it back and applied it (Kafka's
  `waitTillConsumptionCatchesUp`); if the consumer dropped it because another writer's
  record got there first, the write raises RemoteLogMetadataError.
- A partition is ready once its metadata partition was read up to the end offset seen at start.
- `read_only=True` (the proxy, `tierproxy status`): no producer and no CreateTopics; a
  missing topic is an error naming the command that creates it.
- `partitions=` (a copy task's): only the metadata partitions holding those user partitions
  are read, and only their records kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.partitioner import murmur2

from ..errors import MetadataNotReady, RemoteLogMetadataError
from ..files import fsync_directory, write_atomically
from ..model import RemoteLogSegmentMetadata, RemotePartitionDeleteMetadata, TopicIdPartition
from . import RemoteLogMetadataManager
from .cache import RemoteLogMetadataCache
from .partition import PartitionState
from .serde import (
    MetadataDecodeError,
    RemoteLogMetadata,
    deserialize,
    iter_entries,
    serialize,
    topic_id_partition_of,
)
from .snapshot import TopicIds, decode_partition, encode_partition, section_body

log = logging.getLogger(__name__)

DEFAULT_TOPIC = "__remote_log_metadata"
DEFAULT_NUM_PARTITIONS = 50
FLAT_FILE_MAGIC = 1
LEGACY_FLAT_FILE_MAGIC = 0
FLAT_FILE_SUFFIX = ".metadata"
PERSIST_EVERY_RECORDS = 200_000
PERSIST_EVERY_S = 30.0
_MAX_RECORDS_PER_BATCH = 10_000  # records made into objects at once while catching up
_WRITE_GROUP_BYTES = 16 << 20
COMMITTED_OFFSETS_FILE = "committed_offsets"
_HEADER = struct.Struct(">b16sq")
_TOPIC_ALREADY_EXISTS = 36
_MASK32 = 0xFFFFFFFF
_MAX_REMEMBERED_REFUSALS = 1000


def _java_long_hash(value: int) -> int:
    return (value ^ (value >> 32)) & _MASK32


def metadata_partition(tp: TopicIdPartition, num_partitions: int) -> int:
    """Kafka's `RemoteLogMetadataTopicPartitioner.metadataPartition`:
    toPositive(murmur2(big-endian bytes of Objects.hash(idLsb, idMsb, partition))) % n."""
    lsb = tp.topic_id.int & ((1 << 64) - 1)
    msb = tp.topic_id.int >> 64
    h = 1
    for part in (_java_long_hash(lsb), _java_long_hash(msb), tp.partition & _MASK32):
        h = (31 * h + part) & _MASK32
    return (murmur2(h.to_bytes(4, "big")) & 0x7FFFFFFF) % num_partitions


# ---------------------------------------------------------------------------- flat files


def flat_file_name(tp: TopicIdPartition) -> str:
    return f"{tp.topic}-{tp.partition}-{tp.topic_id.hex}{FLAT_FILE_SUFFIX}"


def topic_id_partition_of_file(name: str) -> TopicIdPartition:
    """The user partition a flat file's name says it holds (ValueError if it says none)."""
    topic, partition, topic_id = name.removesuffix(FLAT_FILE_SUFFIX).rsplit("-", 2)
    return TopicIdPartition(uuid.UUID(hex=topic_id), topic, int(partition))


def encode_flat_file(state: PartitionState, metadata_offset: int) -> bytes:
    return _HEADER.pack(FLAT_FILE_MAGIC, state.tp.topic_id.bytes, metadata_offset) + encode_partition(state)


def decode_flat_file(
    data: bytes, tp: TopicIdPartition, topic_ids: TopicIds | None = None
) -> tuple[int, PartitionState]:
    """(metadata topic offset, the partition's state) of the flat file of `tp`."""
    if len(data) < _HEADER.size:
        raise MetadataDecodeError(f"flat file of {len(data)} bytes has no header")
    magic, topic_id, offset = _HEADER.unpack_from(data)
    if topic_id != tp.topic_id.bytes:
        raise MetadataDecodeError(f"flat file of {tp} holds topic id {uuid.UUID(bytes=topic_id)}")
    if magic == LEGACY_FLAT_FILE_MAGIC:
        cache = RemoteLogMetadataCache()
        cache.install(PartitionState(tp))
        for record, _ in iter_entries(data, _HEADER.size):
            if not isinstance(record, (RemoteLogSegmentMetadata, RemotePartitionDeleteMetadata)) \
                    or record.topic_id_partition != tp:
                raise MetadataDecodeError(f"unexpected {record} in the flat file of {tp}")
            cache.restore(record)
        state = cache.partition_state(tp)
        assert state is not None
        return offset, state
    if magic != FLAT_FILE_MAGIC:
        raise MetadataDecodeError(f"unknown flat file magic {magic}")
    state = decode_partition(section_body(memoryview(data)[_HEADER.size:]), topic_ids)
    if state.tp != tp:
        raise MetadataDecodeError(f"flat file of {tp} holds {state.tp}")
    return offset, state


def read_committed_offsets(path: Path) -> dict[int, int]:
    try:
        lines = path.read_text().split("\n")
    except FileNotFoundError:
        return {}
    try:
        if lines[0] != "0":
            raise ValueError(f"version {lines[0]!r}")
        count = int(lines[1])
        pairs = [line.split() for line in lines[2:2 + count]]
        return {int(p): int(o) for p, o in pairs}
    except (ValueError, IndexError) as exc:
        raise RemoteLogMetadataError(f"unreadable {path}: {exc}") from exc


def committed_offsets_text(offsets: Mapping[int, int]) -> str:
    lines = ["0", str(len(offsets))] + [f"{p} {o}" for p, o in sorted(offsets.items())]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- manager


class TopicRemoteLogMetadataManager(RemoteLogMetadataManager):
    def __init__(
        self,
        bootstrap_servers: str | list[str],
        *,
        directory: str | os.PathLike[str],
        topic: str = DEFAULT_TOPIC,
        num_partitions: int = DEFAULT_NUM_PARTITIONS,
        replication_factor: int | None = None,
        retention_ms: int = -1,
        publish_timeout: float = 30.0,
        client_config: Mapping[str, Any] | None = None,
        read_only: bool = False,
        partitions: Iterable[TopicIdPartition] | None = None,
    ) -> None:
        super().__init__(partitions)
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, not {num_partitions}")
        self.bootstrap_servers = bootstrap_servers
        self.directory = Path(directory)
        self.topic = topic
        self.num_partitions = num_partitions
        self.replication_factor = replication_factor
        self.retention_ms = retention_ms
        self.publish_timeout = publish_timeout
        self._client_config = dict(client_config or {})
        self.read_only = read_only
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._consume_task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        # user partition -> last metadata offset reflected in its flat file
        self._file_offsets: dict[TopicIdPartition, int] = {}
        self._committed: dict[int, int] = {}  # metadata partition -> last offset read, in committed_offsets
        self._applied: dict[int, int] = {}  # metadata partition -> last offset read, in the cache
        self._unpersisted: dict[TopicIdPartition, int] = {}  # user partition -> its metadata partition
        self._unpersisted_records = 0
        self._persisted_at = 0.0  # loop time
        self._persisting: asyncio.Task[None] | None = None
        self._catch_up_to: dict[int, int] = {}  # metadata partition -> end offset seen at start
        # The metadata partitions read: all, or those of the partitions this manager keeps.
        read = range(num_partitions) if self.scope is None else {metadata_partition(tp, num_partitions)
                                                                  for tp in self.scope}
        self._ready: dict[int, asyncio.Event] = {p: asyncio.Event() for p in sorted(read)}
        self._loaded = False  # every one of them ready
        self._waiters: dict[int, list[tuple[int, asyncio.Future[None]]]] = defaultdict(list)
        self._dropped: dict[tuple[int, int], str] = {}  # (partition, offset) of records replay refused
        self._failure: BaseException | None = None
        self._started = False
        # How many records the consumer fetched from the topic since start (restart tests count them).
        self.records_fetched = 0
        self.decode_errors = 0

    def metadata_partition(self, tp: TopicIdPartition) -> int:
        return metadata_partition(tp, self.num_partitions)

    # ------------------------------------------------------------------ start / stop

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        await asyncio.to_thread(self._load_directory)
        await self._ensure_topic()
        common = {"bootstrap_servers": self.bootstrap_servers, **self._client_config}
        if not self.read_only:
            self._producer = AIOKafkaProducer(**common, acks="all", enable_idempotence=True)
        self._consumer = AIOKafkaConsumer(
            **common, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
        try:
            if self._producer is not None:
                await self._producer.start()
            await self._consumer.start()
            partitions = [TopicPartition(self.topic, p) for p in self._ready]
            self._consumer.assign(partitions)
            unread = [ktp for ktp in partitions if ktp.partition not in self._committed]
            if unread:
                await self._consumer.seek_to_beginning(*unread)  # one call: each waits for a reset
            for ktp in partitions:
                if ktp.partition in self._committed:
                    self._consumer.seek(ktp, self._committed[ktp.partition] + 1)
            ends = await self._consumer.end_offsets(partitions)
        except BaseException:
            await self.close()
            raise
        for ktp, end in ends.items():
            self._catch_up_to[ktp.partition] = end
            if self._committed.get(ktp.partition, -1) + 1 >= end:
                self._ready[ktp.partition].set()
        self._persisted_at = asyncio.get_running_loop().time()
        self._consume_task = asyncio.create_task(self._consume(), name=f"consume {self.topic}")

    def _load_directory(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._committed = read_committed_offsets(self.directory / COMMITTED_OFFSETS_FILE)
        topic_ids = TopicIds()
        for path in sorted(self.directory.glob(f"*{FLAT_FILE_SUFFIX}")):
            try:
                tp = topic_id_partition_of_file(path.name)
            except ValueError:
                log.warning("%s is not named after a partition: ignored", path)
                continue
            if not self.in_scope(tp):
                continue
            try:
                offset, state = decode_flat_file(path.read_bytes(), tp, topic_ids)
            except (MetadataDecodeError, OSError) as exc:
                # The topic still has every record: read this partition's again.
                p = self.metadata_partition(tp)
                log.warning("%s does not load (%s): reading %s-%d from its beginning", path, exc, self.topic, p)
                self._committed.pop(p, None)
                continue
            self._cache.install(state)
            self._file_offsets[tp] = offset
        self._applied = dict(self._committed)

    async def _ensure_topic(self) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers, **self._client_config)
        await admin.start()
        try:
            # Listing all topics, not describing this one: a Metadata request naming a missing
            # topic may auto-create it with the broker's default partition count.
            if self.topic not in await admin.list_topics():
                if self.read_only:
                    raise RemoteLogMetadataError(
                        f"{self.topic} does not exist yet: the first `tierproxy tier` creates it")
                replication = self.replication_factor
                if replication is None:
                    replication = min(3, len((await admin.describe_cluster())["brokers"]))
                response = await admin.create_topics([NewTopic(
                    self.topic, self.num_partitions, replication,
                    topic_configs={"retention.ms": str(self.retention_ms), "cleanup.policy": "delete"})])
                for name, code, *message in response.topic_errors:
                    if code not in (0, _TOPIC_ALREADY_EXISTS):
                        raise RemoteLogMetadataError(f"cannot create {name}: error {code} {message}")
            existing = await self._wait_for_topic(admin)
            count = len(existing[0]["partitions"])
            if count != self.num_partitions:
                raise RemoteLogMetadataError(
                    f"{self.topic} has {count} partitions, configured num_partitions is {self.num_partitions}")
        finally:
            await admin.close()

    async def _wait_for_topic(self, admin: AIOKafkaAdminClient) -> list[dict[str, Any]]:
        # Metadata of a new topic reaches the brokers shortly after CreateTopics returns.
        for _ in range(100):
            described = await admin.describe_topics([self.topic])
            found = [t for t in described if t["topic"] == self.topic and t["error_code"] == 0 and t["partitions"]]
            if found:
                return found
            await asyncio.sleep(0.1)
        raise RemoteLogMetadataError(f"{self.topic} was created but its metadata never appeared")

    async def close(self) -> None:
        if self._consume_task is not None:
            self._consume_task.cancel()
            # A task that already failed was logged and reported to its waiters.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._consume_task
            self._consume_task = None
        # What was read and not yet written to the flat files (a start stopped while catching up).
        try:
            await self._persist()
        except Exception:  # noqa: BLE001 - the next start reads those records again
            log.warning("writing the flat files of %s at close failed", self.topic, exc_info=True)
        for client in (self._consumer, self._producer):
            if client is not None:
                await client.stop()
        self._consumer = self._producer = None
        self._fail_waiters(RemoteLogMetadataError(f"{self.topic} metadata manager closed"))
        for event in self._ready.values():
            event.clear()
        self._loaded = False

    # ------------------------------------------------------------------ consuming

    async def _consume(self) -> None:
        assert self._consumer is not None
        try:
            while True:
                batches = await self._consumer.getmany(timeout_ms=200, max_records=_MAX_RECORDS_PER_BATCH)
                if batches:
                    await self._apply_batches(batches)
                await self._check_caught_up()
                if self._unpersisted and self._persist_due():
                    await self._persist()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.exception("consuming %s failed", self.topic)
            self._failure = exc
            self._fail_waiters(RemoteLogMetadataError(f"consuming {self.topic} failed: {exc!r}"))
            raise

    async def _apply_batches(self, batches: Mapping[TopicPartition, list[Any]]) -> None:
        for ktp, messages in batches.items():
            p = ktp.partition
            for message in messages:
                self.records_fetched += 1
                self._applied[p] = message.offset
                if message.value is None:
                    continue
                try:
                    record = deserialize(message.value)
                except MetadataDecodeError as exc:
                    self.decode_errors += 1
                    self._dropped[(p, message.offset)] = str(exc)
                    log.warning("%s-%d offset %d: %s", self.topic, p, message.offset, exc)
                    continue
                tp = topic_id_partition_of(record)
                if message.offset <= self._file_offsets.get(tp, -1) or not self.in_scope(tp):
                    continue  # already in its flat file, or not kept here
                if not self._cache.replay(record):
                    self._dropped[(p, message.offset)] = f"{record} breaks the remote log rules"
                self._unpersisted[tp] = p
                self._unpersisted_records += 1
        for ktp in batches:
            if self._applied[ktp.partition] + 1 >= self._catch_up_to.get(ktp.partition, 0):
                self._ready[ktp.partition].set()
        if self._persist_due():
            await self._persist()
        for ktp in batches:
            self._release_waiters(ktp.partition, self._applied[ktp.partition])

    def _persist_due(self) -> bool:
        if all(event.is_set() for event in self._ready.values()):
            return True
        # Reading from far behind: rewriting every partition's file after each batch would cost
        # more than the reading.
        return (self._unpersisted_records >= PERSIST_EVERY_RECORDS
                or asyncio.get_running_loop().time() - self._persisted_at >= PERSIST_EVERY_S)

    async def _persist(self) -> None:
        """Writes the flat files of the partitions changed since the last call, then the
        committed offsets. Once begun it runs to its end, even if the caller is cancelled, so
        files and offsets are never written by two calls at once."""
        if self._persisting is not None:
            await asyncio.shield(self._persisting)
        if not self._unpersisted and self._applied == self._committed:
            return
        self._persisting = asyncio.ensure_future(self._write_files())
        try:
            await asyncio.shield(self._persisting)
        finally:
            if self._persisting.done():
                self._persisting = None

    async def _write_files(self) -> None:
        # Encoded here (the consumer, which alone changes the cache, waits for this), written in
        # a thread a group at a time: not every partition's file in memory at once.
        touched, self._unpersisted, self._unpersisted_records = self._unpersisted, {}, 0
        committed = dict(self._applied)
        group: dict[TopicIdPartition, bytes] = {}
        size = 0
        for tp, p in touched.items():
            state = self._cache.partition_state(tp)
            if state is None:
                continue
            group[tp] = data = encode_flat_file(state, committed[p])
            size += len(data)
            if size >= _WRITE_GROUP_BYTES:
                await asyncio.to_thread(self._write_flat_files, group)
                group, size = {}, 0
        await asyncio.to_thread(self._write_flat_files, group, committed)
        for tp, p in touched.items():
            self._file_offsets[tp] = committed[p]
        self._committed = committed
        self._persisted_at = asyncio.get_running_loop().time()

    def _write_flat_files(self, files: Mapping[TopicIdPartition, bytes], committed: Mapping[int, int] | None = None
                          ) -> None:
        """With `committed`, the last group: then the committed offsets, and one directory fsync
        for all the renames (a crash before it may leave a flat file newer than the offsets,
        which a restart handles)."""
        for tp, data in files.items():
            write_atomically(self.directory / flat_file_name(tp), data, sync_directory=False)
        if committed is not None:
            write_atomically(self.directory / COMMITTED_OFFSETS_FILE, committed_offsets_text(committed).encode(),
                             sync_directory=False)
            fsync_directory(self.directory)

    async def _check_caught_up(self) -> None:
        # A partition whose last records were not data (or were skipped) is caught up by position.
        assert self._consumer is not None
        for p, event in self._ready.items():
            if not event.is_set():
                position = await self._consumer.position(TopicPartition(self.topic, p))
                if position >= self._catch_up_to.get(p, 0):
                    event.set()

    def _release_waiters(self, partition: int, consumed: int) -> None:
        waiting = self._waiters.get(partition, [])
        still = []
        for offset, future in waiting:
            if offset > consumed:
                still.append((offset, future))
                continue
            if future.done():
                continue
            reason = self._dropped.pop((partition, offset), None)
            if reason is None:
                future.set_result(None)
            else:
                future.set_exception(RemoteLogMetadataError(f"record at {self.topic}-{partition}@{offset} was "
                                                            f"not applied: {reason}"))
        self._waiters[partition] = still
        # Refusals nobody waits for (another instance's records) are kept only for a while.
        while len(self._dropped) > _MAX_REMEMBERED_REFUSALS:
            del self._dropped[next(iter(self._dropped))]

    def _fail_waiters(self, error: RemoteLogMetadataError) -> None:
        for waiting in self._waiters.values():
            for _, future in waiting:
                if not future.done():
                    future.set_exception(error)
        self._waiters.clear()

    # ------------------------------------------------------------------ writing

    async def _publish(self, record: RemoteLogMetadata) -> None:
        if self.read_only:
            raise RemoteLogMetadataError(f"{self.topic} metadata manager is read-only")
        if self._producer is None:
            raise MetadataNotReady(f"{self.topic} metadata manager is not started")
        tp = topic_id_partition_of(record)
        p = self.metadata_partition(tp)
        # Checks run against a caught-up view of the partition, and one write at a time from here.
        await self.wait_until_ready(tp, self.publish_timeout)
        async with self._write_lock:
            self._cache.check(record)
            sent = await self._producer.send_and_wait(self.topic, serialize(record), partition=p)
            await self._wait_consumed(p, sent.offset)

    async def _wait_consumed(self, partition: int, offset: int) -> None:
        if self._failure is not None:
            raise RemoteLogMetadataError(f"consuming {self.topic} failed") from self._failure
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[partition].append((offset, future))
        if self._applied.get(partition, -1) >= offset:
            self._release_waiters(partition, self._applied[partition])
        try:
            await asyncio.wait_for(future, self.publish_timeout)
        except TimeoutError:
            raise RemoteLogMetadataError(
                f"record at {self.topic}-{partition}@{offset} not read back within {self.publish_timeout}s") from None

    # ------------------------------------------------------------------ readiness

    def _is_ready(self, tp: TopicIdPartition) -> bool:
        return self._ready[self.metadata_partition(tp)].is_set()

    def is_loaded(self) -> bool:
        if not self._loaded:  # once caught up, a metadata partition stays so until closed
            self._loaded = all(ready.is_set() for ready in self._ready.values())
        return self._loaded

    async def wait_until_ready(self, tp: TopicIdPartition, timeout: float) -> None:
        self._check_scope(tp)
        try:
            await asyncio.wait_for(self._ready[self.metadata_partition(tp)].wait(), timeout)
        except TimeoutError:
            raise MetadataNotReady(
                f"remote log metadata of {tp} ({self.topic}-{self.metadata_partition(tp)}) "
                f"not caught up after {timeout}s") from None
