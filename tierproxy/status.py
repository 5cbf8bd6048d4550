"""`tierproxy status`: the offsets of every tiered partition and whether they are safe.

For each partition of the tiered topics in the configuration, the offsets of KIP-405
(seed 001), from the broker and from the remote log metadata:

    Lx  local log start offset   ListOffsets EARLIEST on the broker
    Ly  last stable offset       ListOffsets LATEST, READ_COMMITTED
    Lz  local log end offset     ListOffsets LATEST (the high watermark)
    Rx  remote log start offset  lowest start offset of the COPY_SEGMENT_FINISHED segments
    Ry  remote log end offset    highest end offset of those segments (inclusive)

and the invariants: Lz >= Ly >= Lx and, once remote data exists, Ly >= Ry >= Rx and
Lx <= Ry + 1. The last one is the one that loses data: offsets in [Ry + 1, Lx) are
neither in remote storage nor on the broker any more.

It also reads the manifest of every COPY_SEGMENT_FINISHED segment for the id of the key
that encrypts it (storage.encryption): the segments per key id, so that an operator knows
when a retired key may leave `remote.log.storage.encryption.keys`, and, as a problem,
every segment whose key that setting does not list or whose data key the key listed under
that id does not unwrap (other material: it cannot be read), and with
`remote.log.storage.encryption.required=true` every segment stored unencrypted (refused).

Every object a segment's manifest lists is checked in the store: that it is there with the
size the manifest records (a HEAD, or a stat, per object); with `--verify` its CRC-32C too,
as recorded by the store at upload (S3) or read back (a whole read of every remote byte
where the store keeps no checksum). A segment with an object missing, or of another size or
CRC-32C, is a problem: it cannot be read. The pipeline checks the same, with the CRC-32C,
before it trims a partition over a segment, and stops that partition's trim at one that fails.

With `remote.log.metadata.backend=remote` (a read replica) the metadata is what the origin's
pipeline published into the store, and status also tells how long ago that was published.
Read replica topics (`topic.<name>.remote.log.read.replica=true`) are listed too: their
remote range is the origin's partition's (another topic id, joined by name), what the proxy
serves; Lx, Ly and Lz are the replica broker's own log of the topic as it is (empty), so
only their own order is checked, not the local-remote invariants (those hold on the
origin). Their segments' keys are checked as above: a replica reads them with its own
configured keys, and each one's data key must unwrap with the key of its id.
A replica partition the remote log metadata does not name is a problem (the proxy answers
it REPLICA_NOT_AVAILABLE), and so is remote log metadata that is missing under the store's
key prefix or has an object that does not read (named, with the bucket and prefix). A
replica topic with fewer partitions on this cluster than the origin's (as its pipeline
publishes the count into the store, else as the remote log metadata knows it) is a problem:
the partitions it lacks are never served, and `tierproxy replica create` adds them.

Exit codes: 0 every invariant holds, every segment is readable and its key configured, 1 otherwise
(each such partition, or the metadata object, is named on stderr), 2 the configuration is invalid or the
cluster, metadata or remote storage cannot be read. Reads only; never imports pyspark.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeGuard

from aiokafka.errors import KafkaError

from tierproxy.client.cluster import READ_COMMITTED, Cluster, ClusterError, TopicInfo
from tierproxy.protocol.apis import OffsetSpec
from tierproxy.proxy.filters.replica import ReadReplicas
from tierproxy.replica import known_partition_counts, published_partition_counts
from tierproxy.storage.encryption import KeyRing
from tierproxy.storage.errors import (
    CorruptRemoteSegment,
    MetadataNotReady,
    RemoteLogMetadataError,
    RemoteResourceNotFound,
    RemoteStorageError,
    WrongEncryptionKey,
)
from tierproxy.storage.factory import remote_log_metadata_manager, remote_storage_manager
from tierproxy.storage.manifest import Manifest
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.metadata.bucket import BucketRemoteLogMetadataManager
from tierproxy.storage.metadata.topic_store import COMMITTED_OFFSETS_FILE, DEFAULT_TOPIC, FLAT_FILE_SUFFIX
from tierproxy.storage.model import RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from tierproxy.storage.rsm import RemoteStorageManager
from tierproxy.storage.verify import SegmentDamage, check_segments

from tierproxy.config import Config, ConfigError, key_files, load, REMOTE_LOG_METADATA_BACKEND, \
    REMOTE_LOG_METADATA_DIR, REMOTE_LOG_STORAGE_ENCRYPTION_ACTIVE_KEY, REMOTE_LOG_STORAGE_ENCRYPTION_KEYS, \
    REMOTE_LOG_STORAGE_ENCRYPTION_REQUIRED
from tierproxy.config.tables import text_table

EXIT_OK = 0
EXIT_BROKEN = 1
EXIT_ERROR = 2
DEFAULT_TIMEOUT_S = 30.0  # the `--timeout` of tierproxy/cli.py
MANIFEST_READS = 16  # segment manifests read from remote storage at once


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    topic_id: str
    lx: int  # local log start offset
    ly: int  # last stable offset
    lz: int  # local log end offset
    rx: int | None  # remote log start offset, None without remote data
    ry: int | None  # remote log end offset (last offset in remote storage)
    remote_segments: int  # COPY_SEGMENT_FINISHED segments
    remote_bytes: int
    problems: tuple[str, ...] = field(default=())
    # Segments per id of the key that encrypts them (unencrypted ones are not counted).
    encryption_keys: dict[str, int] = field(default_factory=dict)
    # Manifests that could not be read (a segment deleted since it was listed, or a broken
    # copy): not counted above, and no problem of status's.
    warnings: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def ok(self) -> bool:
        return not self.problems


def broken_invariants(lx: int, ly: int, lz: int, rx: int | None, ry: int | None) -> tuple[str, ...]:
    """Each invariant of seed 001 that does not hold, in words."""
    problems = []
    if not lz >= ly:
        problems.append(f"Lz >= Ly broken: local log end {lz} < last stable offset {ly}")
    if not ly >= lx:
        problems.append(f"Ly >= Lx broken: last stable offset {ly} < local log start {lx}")
    if rx is not None and ry is not None:
        # Seed 001 writes Ly >= Ry; Ry is the last offset held remotely and Ly the first
        # offset not yet stable, so the remote end must lie strictly below Ly.
        if not ly > ry:
            problems.append(f"Ly > Ry broken: remote log end {ry} is not below the last stable offset {ly}")
        if not ry >= rx:
            problems.append(f"Ry >= Rx broken: remote log end {ry} < remote log start {rx}")
        if not lx <= ry + 1:
            problems.append(
                f"gap: offsets [{ry + 1}, {lx - 1}] are neither remote (Ry={ry}) nor local (Lx={lx})"
            )
    return tuple(problems)


@dataclass(frozen=True)
class KeyUsage:
    """A key id of the configuration, or of a segment: its file, whether it is the active
    key, and the COPY_SEGMENT_FINISHED segments (of the tiered topics) it encrypts."""

    key_id: str
    file: str | None  # None: the configuration does not list it
    active: bool
    segments: int


@dataclass(frozen=True)
class Report:
    partitions: list[PartitionStatus]
    missing_topics: list[str]  # tiered in the configuration but not in the cluster
    encryption_keys: list[KeyUsage] = field(default_factory=list)
    # remote.log.metadata.backend=remote: seconds since the metadata read was published
    # (None when nothing was published yet, or with another backend).
    metadata_published_seconds_ago: float | None = None
    replica_topics: frozenset[str] = frozenset()  # topic.<name>.remote.log.read.replica=true
    metadata_problems: list[str] = field(default_factory=list)  # the remote log metadata as a whole
    topic_problems: tuple[str, ...] = ()  # of whole topics (a replica topic's partitions)
    tables: list[Any] = field(default_factory=list)  # pipeline.iceberg.status.TableStatus, per table

    @property
    def ok(self) -> bool:
        return not self.metadata_problems and not self.topic_problems and all(p.ok for p in self.partitions)

    def to_json(self) -> dict[str, Any]:
        partitions = []
        for p in self.partitions:
            entry = asdict(p)
            entry["problems"] = list(p.problems)
            entry["warnings"] = list(p.warnings)
            entry["ok"] = p.ok
            partitions.append(entry)
        return {"ok": self.ok, "partitions": partitions, "missing_topics": self.missing_topics,
                "encryption_keys": [asdict(k) for k in self.encryption_keys],
                "metadata_published_seconds_ago": self.metadata_published_seconds_ago,
                "metadata_problems": self.metadata_problems, "topic_problems": list(self.topic_problems),
                "iceberg_tables": [{**asdict(t), "committed": {str(p): o for p, o in t.committed.items()}}
                                   for t in self.tables]}


# --------------------------------------------------------------------------- collecting


async def _metadata_manager(config: Config, stack: AsyncExitStack, cluster: Cluster) -> RemoteLogMetadataManager | None:
    """A started metadata manager that cannot disturb a running pipeline or proxy, or None
    when no remote log metadata exists yet."""
    if config[REMOTE_LOG_METADATA_BACKEND] in ("file", "remote"):
        return await stack.enter_async_context(remote_log_metadata_manager(config, read_only=True))
    # The topic backend writes materialized files into its directory: never into the
    # directory a running pipeline or proxy owns. Start from a copy of it (committed
    # offsets first, then the flat files, which are thus at least as new) so the topic is
    # not re-read from the beginning; and never create the topic from here.
    if DEFAULT_TOPIC not in await cluster.topics([DEFAULT_TOPIC]):
        return None
    copy = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tierproxy-status-")))
    source = Path(config[REMOTE_LOG_METADATA_DIR])
    if source.is_dir():
        for path in [source / COMMITTED_OFFSETS_FILE, *sorted(source.glob(f"*{FLAT_FILE_SUFFIX}"))]:
            if path.is_file():
                shutil.copyfile(path, copy / path.name)
    values = {**config.values, "remote.log.metadata.dir": copy}
    return await stack.enter_async_context(remote_log_metadata_manager(values, read_only=True))


async def _remote_partition(replicas: ReadReplicas | None, tp: TopicIdPartition, timeout: float) -> TopicIdPartition:
    """The partition in the remote log metadata: a read replica's is the origin's (another
    topic id, known once the metadata has loaded: waited for up to `timeout`), this
    cluster's partition when nothing of it is tiered yet."""
    if replicas is None or tp.topic not in replicas:
        return tp
    deadline = time.monotonic() + timeout
    while True:
        try:
            return replicas.named_partition(tp.topic, tp.partition) or tp
        except MetadataNotReady:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.1)


def _metadata_problems(rlmm: RemoteLogMetadataManager | None) -> list[str]:
    """What is wrong with the remote log metadata as a whole (its store's `problem`)."""
    problem = rlmm.problem if rlmm is not None else None
    return [str(problem)] if problem is not None else []


def _unnamed_replica_partition(replicas: ReadReplicas | None, topic: str, partition: int,
                               origin_partitions: int | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(problems, warnings) of a read replica partition the loaded remote log metadata does
    not name. One of a topic the metadata names other partitions of, and that the origin's
    published partition count covers, is only not tiered yet there (a warning); any other is
    a problem: metadata that names nothing of the topic may be looked for in the wrong place."""
    if replicas is None or topic not in replicas or replicas.named_partition(topic, partition) is not None:
        return (), ()
    if (origin_partitions is not None and partition < origin_partitions
            and any(replicas.named_partition(topic, p) is not None for p in range(origin_partitions))):
        return (), (f"the origin has not tiered partition {partition} of {topic} yet (it has {origin_partitions}): "
                    "the proxy answers it REPLICA_NOT_AVAILABLE until its first segment is tiered",)
    return (f"the remote log metadata names no partition {partition} of {topic}: the proxy answers it "
            "REPLICA_NOT_AVAILABLE (nothing of it is tiered yet, or remote.log.storage.* name another store or "
            "key prefix than the origin's)",), ()


def _finished(rlmm: RemoteLogMetadataManager | None, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
    if rlmm is None:
        return []
    return [s for s in rlmm.list_segments(tp) if s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED]


@dataclass(frozen=True)
class SegmentFound:
    """What status found of one segment in the store: the id of its encryption key (None
    when it is not encrypted), why its manifest could not be read, and what is wrong with
    its objects."""

    key_id: str | None = None
    manifest_error: str | None = None
    damage: SegmentDamage | None = None
    key_error: str | None = None  # the key configured under key_id does not unwrap its data key


async def _segments_found(rsm: RemoteStorageManager, keys: KeyRing, segments: list[RemoteLogSegmentMetadata], *,
                          verify: bool) -> list[SegmentFound]:
    """Per segment, its manifest read, its data key unwrapped with the configured key of its
    id (`keys`), and every object it lists checked in the store: its size, and with `verify`
    its CRC-32C (storage.verify). A store that cannot be read at all raises."""
    checked = await check_segments(rsm, segments, check_crc=verify, concurrency=MANIFEST_READS)
    # An object missing may be a delete of remote retention that began after the segments
    # were listed (it removes the manifest first): such a segment is looked at once more.
    again = iter(await check_segments(rsm, [c.segment for c in checked if _object_damage(c)],
                                      check_crc=verify, concurrency=MANIFEST_READS))
    found = []
    for segment, result in zip(segments, checked):
        if _object_damage(result):
            result = next(again)
        if isinstance(result, SegmentDamage) and result.key is None:
            found.append(SegmentFound(manifest_error=result.error))
            continue
        if isinstance(result, SegmentDamage):
            try:
                manifest = await rsm.fetch_manifest(segment)
            except (RemoteResourceNotFound, CorruptRemoteSegment) as e:
                found.append(SegmentFound(manifest_error=str(e)))
                continue
            damage: SegmentDamage | None = result
        else:
            manifest, damage = result, None
        found.append(SegmentFound(manifest.encryption.key_id if manifest.encryption else None, None, damage,
                                  _key_error(keys, segment, manifest)))
    return found


def _key_error(keys: KeyRing, segment: RemoteLogSegmentMetadata, manifest: Manifest) -> str | None:
    """Why the configured key of the segment's key id does not open its envelope (other
    material under that id), or None. A key id not configured is `_encryption`'s problem."""
    if manifest.encryption is None or manifest.encryption.key_id not in keys.keys:
        return None
    try:
        keys.open_segment(segment.segment_id.id, manifest.encryption, f"segment {segment.segment_id.id}")
    except WrongEncryptionKey as e:
        return str(e)
    return None


def _object_damage(result: object) -> TypeGuard[SegmentDamage]:
    return isinstance(result, SegmentDamage) and result.key is not None


def _encryption(
    segments: list[RemoteLogSegmentMetadata], found: list[SegmentFound], configured: Iterable[str],
    required: bool,
) -> tuple[dict[str, int], tuple[str, ...], tuple[str, ...]]:
    """(segments per key id, problems, warnings) of one partition's segments."""
    used: Counter[str] = Counter()
    problems, warnings = [], []
    for segment, f in zip(segments, found):
        key_id = f.key_id
        name = f"segment {segment.segment_id.id} (offsets {segment.start_offset}-{segment.end_offset})"
        if f.manifest_error is not None:
            warnings.append(f"{name}: manifest not read: {f.manifest_error}")
            continue
        if f.damage is not None:
            problems.append(f"{name} cannot be read: {f.damage.error}")
        if f.key_error is not None:
            problems.append(f"{name} cannot be read: {f.key_error}")
        if key_id is not None:
            used[key_id] += 1
            if key_id not in configured:
                problems.append(f"{name} is encrypted with key {key_id!r}, which "
                                f"{REMOTE_LOG_STORAGE_ENCRYPTION_KEYS.name} does not list: it cannot be read")
        elif required:
            problems.append(f"{name} is stored unencrypted and {REMOTE_LOG_STORAGE_ENCRYPTION_REQUIRED.name}=true: "
                            "it is refused when read")
    return dict(sorted(used.items())), tuple(problems), tuple(warnings)


def _key_usage(config: Config, partitions: list[PartitionStatus]) -> list[KeyUsage]:
    """The configured keys in their order, then the ids segments name that it lacks."""
    files = key_files(config[REMOTE_LOG_STORAGE_ENCRYPTION_KEYS])
    used: Counter[str] = Counter()
    for p in partitions:
        used.update(p.encryption_keys)
    active = config[REMOTE_LOG_STORAGE_ENCRYPTION_ACTIVE_KEY]
    usage = [KeyUsage(key_id, str(path), key_id == active, used[key_id]) for key_id, path in files.items()]
    return usage + [KeyUsage(key_id, None, False, count) for key_id, count in sorted(used.items())
                    if key_id not in files]


async def collect(config: Config, *, timeout: float = DEFAULT_TIMEOUT_S,
                  rsm: RemoteStorageManager | None = None, verify: bool = False) -> Report:
    """Reads in an order that a running pipeline cannot turn into a false alarm: the
    pipeline advances Lx only after Ry covers it, and Ly and Lz only grow. So Lx is read
    before the remote metadata, and Ly and then Lz after it. The segments' manifests and
    objects come last (`rsm`, by default the configuration's); `verify` checks each
    object's CRC-32C too."""
    wanted = [t.name for t in config.tiered_topics + config.read_replica_topics]
    replica_names = frozenset(t.name for t in config.read_replica_topics)
    async with AsyncExitStack() as stack:
        rsm = await stack.enter_async_context(rsm if rsm is not None else remote_storage_manager(config))
        cluster = await stack.enter_async_context(Cluster.from_config(config, client_id="tierproxy-status"))
        topics = await cluster.topics(wanted)  # with no tiered topic, still a login check
        missing = [name for name in wanted if name not in topics]
        tps = [(name, p) for name in wanted if name in topics for p in sorted(topics[name].partitions)]
        if not tps:
            return Report([], missing, _key_usage(config, []), replica_topics=replica_names)
        earliest = await cluster.list_offsets(topics, tps, OffsetSpec.EARLIEST)
        rlmm = await _metadata_manager(config, stack, cluster)
        metadata_problems = _metadata_problems(rlmm)
        if rlmm is not None and metadata_problems and not rlmm.is_loaded():  # nothing to show offsets from
            return Report([], missing, _key_usage(config, []), replica_topics=replica_names,
                          metadata_problems=metadata_problems)
        replicas = ReadReplicas((t.name for t in config.read_replica_topics), rlmm) if rlmm else None
        ids = {tp: await _remote_partition(replicas, TopicIdPartition(topics[tp[0]].topic_id, *tp), timeout)
               for tp in tps}
        published = {name: count for name, count in (await published_partition_counts(rsm)).items()
                     if name in replica_names} if replica_names else {}
        unnamed = {tp: _unnamed_replica_partition(replicas, tp[0], tp[1], published.get(tp[0])) for tp in tps}
        if rlmm is not None:
            for tid in ids.values():
                await rlmm.wait_until_ready(tid, timeout)
        remote = {tp: (rlmm.log_start_offset(ids[tp]), rlmm.log_end_offset(ids[tp])) if rlmm else (None, None)
                  for tp in tps}
        finished = {tp: _finished(rlmm, ids[tp]) for tp in tps}
        stable = await cluster.list_offsets(topics, tps, OffsetSpec.LATEST, isolation_level=READ_COMMITTED)
        latest = await cluster.list_offsets(topics, tps, OffsetSpec.LATEST)
        key_ring = KeyRing.from_config(config)
        found = {tp: await _segments_found(rsm, key_ring, finished[tp], verify=verify) for tp in tps}
        published_ago = _published_seconds_ago(rlmm)
        topic_problems = _replica_partition_problems(replica_names, topics, published, rlmm)
        tables = await asyncio.to_thread(_tables, config, topics, finished)
    configured = key_files(config[REMOTE_LOG_STORAGE_ENCRYPTION_KEYS])
    partitions = []
    for tp in tps:
        lx, ly, lz = earliest[tp].offset, stable[tp].offset, latest[tp].offset
        rx, ry = remote[tp]
        segments = finished[tp]
        keys, key_problems, warnings = _encryption(segments, found[tp], configured,
                                                   config[REMOTE_LOG_STORAGE_ENCRYPTION_REQUIRED])
        partitions.append(PartitionStatus(
            tp[0], tp[1], str(ids[tp].topic_id), lx, ly, lz, rx, ry, len(segments),
            sum(s.segment_size_in_bytes for s in segments),
            unnamed[tp][0] + _invariants(tp[0] in replica_names, lx, ly, lz, rx, ry) + key_problems, keys,
            unnamed[tp][1] + warnings,
        ))
    return Report(partitions, missing, _key_usage(config, partitions), published_ago, replica_names,
                  metadata_problems, topic_problems, tables)


def _tables(config: Config, topics: dict[str, TopicInfo],
            finished: dict[tuple[str, int], list[RemoteLogSegmentMetadata]]) -> list[Any]:
    """The Iceberg tables of the topics that have one (the pipeline's extra brings pyiceberg)."""
    names = [t.name for t in config.tiered_topics if t.iceberg_enable and t.name in topics]
    if not names or importlib.util.find_spec("pyiceberg") is None:
        return []
    from tierproxy.pipeline.failures import one_line
    from tierproxy.pipeline.iceberg.status import TableStatus, table_status

    tables = []
    for name in names:
        segments = {p: finished[(t, p)] for t, p in finished if t == name}
        try:
            tables.append(table_status(config, name, str(topics[name].topic_id), segments))
        except Exception as e:  # the catalog is down: the offsets are still worth showing
            tables.append(TableStatus(f"{name}", False, error=one_line(e)))
    return tables


def _replica_partition_problems(names: frozenset[str], topics: dict[str, TopicInfo], published: dict[str, int],
                                rlmm: RemoteLogMetadataManager | None) -> tuple[str, ...]:
    """Each replica topic of `names` with fewer partitions on this cluster than the origin's,
    as the origin's pipeline `published` the count, else as the remote log metadata knows it."""
    origin = (known_partition_counts(rlmm, names) if rlmm is not None else {}) | published
    problems = []
    for name in sorted(names & topics.keys()):
        have, count = len(topics[name].partitions), origin.get(name, 0)
        if have < count:
            problems.append(f"read replica topic {name} has {have} partitions on this cluster, the origin's {count}: "
                            f"partitions {have}-{count - 1} are never served; `tierproxy replica create` adds them")
    return tuple(problems)


def _invariants(read_replica: bool, lx: int, ly: int, lz: int, rx: int | None, ry: int | None) -> tuple[str, ...]:
    """A read replica's broker holds its own (empty) log of the topic, not the one the remote
    range continues (that is the origin's): only its own offsets' order is checked."""
    return broken_invariants(lx, ly, lz, None, None) if read_replica else broken_invariants(lx, ly, lz, rx, ry)


def _published_seconds_ago(rlmm: RemoteLogMetadataManager | None) -> float | None:
    if not isinstance(rlmm, BucketRemoteLogMetadataManager) or rlmm.published_ms is None:
        return None
    return max(0.0, time.time() - rlmm.published_ms / 1000)


# --------------------------------------------------------------------------- output


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def format_table(report: Report) -> str:
    header = ("PARTITION", "LX", "LY", "LZ", "RX", "RY", "SEGMENTS", "BYTES", "INVARIANTS")
    rows = [header] + [
        (p.name, str(p.lx), str(p.ly), str(p.lz), _cell(p.rx), _cell(p.ry), str(p.remote_segments),
         str(p.remote_bytes), "ok" if p.ok else "BROKEN")
        for p in report.partitions
    ]
    # Names to the left, numbers to the right, as in kafka-consumer-groups.sh.
    lines = text_table(rows, right_aligned=range(1, len(header) - 1))
    lines.append("LX local log start, LY last stable offset, LZ local log end (broker); "
                 "RX remote log start, RY remote log end (COPY_SEGMENT_FINISHED segments)")
    replicas = sorted({p.topic for p in report.partitions} & report.replica_topics)
    if replicas:
        lines.append(f"Read replica topics ({', '.join(replicas)}): LX, LY, LZ are this cluster's own log of the "
                     "topic, which a replica leaves empty; the proxy serves RX to RY from remote storage.")
    if report.metadata_published_seconds_ago is not None:
        lines.append(f"Remote log metadata published into the remote store "
                     f"{report.metadata_published_seconds_ago:.0f}s ago (remote.log.metadata.backend=remote).")
    if report.tables:
        from tierproxy.pipeline.iceberg.status import format_tables

        lines.append("")
        lines += format_tables(report.tables)
    if report.encryption_keys:
        lines.append("")
        keys = [("KEY", "FILE", "SEGMENTS")] + [
            (k.key_id, k.file or "NOT CONFIGURED", f"{k.segments} (active)" if k.active else str(k.segments))
            for k in report.encryption_keys
        ]
        lines += text_table(keys)
        lines.append(f"Segments encrypted with each key of {REMOTE_LOG_STORAGE_ENCRYPTION_KEYS.name}; "
                     "a key may leave it once it encrypts none.")
    return "\n".join(lines)


def report_problems(report: Report, err: TextIO) -> None:
    for problem in (*report.metadata_problems, *report.topic_problems):
        print(f"tierproxy status: {problem}", file=err)
    for name in report.missing_topics:
        if name in report.replica_topics:
            print(f"tierproxy status: read replica topic {name} does not exist in the cluster: "
                  "`tierproxy replica create` creates it", file=err)
        else:
            print(f"tierproxy status: tiered topic {name} does not exist in the cluster", file=err)
    for p in report.partitions:
        for problem in p.problems:
            print(f"tierproxy status: {p.name}: {problem}", file=err)
        for warning in p.warnings:
            print(f"tierproxy status: {p.name}: warning: {warning}", file=err)


def status(
    path: str | None, overrides: Iterable[str], *, as_json: bool, timeout: float, out: TextIO, err: TextIO,
    verify: bool = False,
) -> int:
    try:
        config = load(path, overrides)
        rsm = remote_storage_manager(config)  # reads the encryption keys' files
    except ConfigError as e:
        print(f"tierproxy status: invalid configuration: {e}", file=err)
        return EXIT_ERROR
    try:
        report = asyncio.run(collect(config, timeout=timeout, rsm=rsm, verify=verify))
    except RemoteStorageError as e:
        print(f"tierproxy status: cannot read the remote segments: {e}", file=err)
        return EXIT_ERROR
    except (OSError, ClusterError, ConfigError, KafkaError, MetadataNotReady, RemoteLogMetadataError,
            TimeoutError) as e:
        print(f"tierproxy status: cannot read the offsets: {e}", file=err)
        return EXIT_ERROR
    if as_json:
        print(json.dumps(report.to_json(), indent=2), file=out)
    else:
        print(format_table(report), file=out)
    report_problems(report, err)
    return EXIT_OK if report.ok else EXIT_BROKEN


def run(args: argparse.Namespace) -> int:
    return status(args.config, args.override, as_json=args.json, timeout=args.timeout,
                  out=sys.stdout, err=sys.stderr, verify=args.verify)
