"""A topic produced, tiered and trimmed, with a proxy in front: the set-up of the end-to-end
tests of the remote path.

A `TopicSpec` says what is produced (`Timed` records or the `Mixed` data set), how many
partitions, how much of each is tiered in segments of what size, and to which store (local
files or S3, encrypted or not). `TieredTopics` builds a spec on a cluster (one node, three,
SASL: each partition is read at its leader, and a cluster that speaks no PLAINTEXT to
clients is tiered through its PLAINTEXT inter-broker listener), and remembers every segment
copied with its local files, so that a test can upload the very same segments again (moto
forgets its objects when it restarts). The `tiered_topics` fixture builds each spec once per
run, for the modules that only read it; `own_tiered_topics` builds for one module, which
may change what it got.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
import uuid
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tierproxy.client.cluster import Cluster
from tierproxy.config import Config, parse
from tierproxy.config.properties import read_properties
from tierproxy.protocol.apis import OffsetSpec
from tierproxy.protocol.records import iter_batches
from tierproxy.storage.factory import remote_storage_manager
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tierproxy.storage.model import LogSegmentData, RemoteLogSegmentMetadata, TopicIdPartition
from tierproxy.storage.rsm import RemoteStorageManager
from testbed.kafka import KafkaCluster
from testbed.s3 import S3Server
from tests.helpers.produce import (
    ProducedRecord,
    produce_codecs,
    produce_mixed,
    produce_split_abort,
    produce_timed,
    wait_for_markers,
)
from tests.helpers.proxy import ProxyThread, proxy_config, running
from tests.helpers.remote_tier import read_log, tier_log

RAW_FETCH_BYTES = 1 << 20


@dataclass(frozen=True)
class Timed:
    """`per_partition` records per partition with explicit CREATE_TIME timestamps growing by
    `step_ms` from `age_ms` ago (`produce_timed`). `outliers`: (partition, i, shift ms), the
    i-th record of the partition is stamped `shift` after the first instead."""

    per_partition: int = 1500
    value_size: int = 200
    step_ms: int = 10
    age_ms: int = 0
    outliers: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class Mixed:
    """Every codec and a committed and an aborted transaction over every partition
    (`produce_mixed`). `split_abort`: then an aborted transaction on partition 0 in two
    batches, and partition 0's remote/local boundary between them; `then_per_codec`: then
    that many records of each codec; `marker_starts_segment`: the ABORT marker of partition
    0 starts a segment of its own, so that its aborted records are in a segment whose
    transaction index does not list them."""

    per_codec: int
    per_transaction: int
    split_abort: bool = False
    then_per_codec: int = 0
    marker_starts_segment: bool = False


@dataclass(frozen=True)
class TopicSpec:
    """What `TieredTopics` builds: a topic of `partitions`, what is produced to it, the first
    `fraction` of each partition in `tier` (default: all) copied to the store on batch
    boundaries in segments of about `segment_bytes`, then (`trim`) the broker's log start
    offset advanced to each cut. `encryption`: the key id each partition is copied under,
    None for plaintext (keys k1, k2, ... are generated)."""

    produce: Timed | Mixed = Timed()
    partitions: int = 2
    replication: int = 1
    fraction: float = 0.6
    tier: tuple[int, ...] | None = None
    segment_bytes: int = 32 * 1024
    store: Literal["local", "s3"] = "local"
    encryption: tuple[str | None, ...] = ()
    trim: bool = True


#: Two partitions of 1500 timed records, 60% remote; record 100 of partition 1 is stamped 30
#: minutes after the others (the partition's MAX_TIMESTAMP is in its remote part).
TWO_TIMED_PARTITIONS = TopicSpec(Timed(1500, outliers=((1, 100, 30 * 60 * 1000),)), partitions=2)

#: Four partitions of 2500 records of 1 KB (10 MB), the first 90% of each remote only, in
#: 256 KiB segments: the replays through `serve` (workers, memory) read it, built once a run.
FOUR_KB_PARTITIONS = TopicSpec(Timed(2500, value_size=1000), partitions=4, fraction=0.9, segment_bytes=256 * 1024)


@dataclass
class TieredTopic:
    """A topic whose oldest records are in the remote tier only."""

    topic: str
    topic_id: uuid.UUID
    records: list[ProducedRecord]  # by (partition, offset)
    #: partition -> the broker's local log start after the trim (0 where nothing was tiered)
    boundary: dict[int, int]
    #: every segment copied, with the local files it was copied from
    copies: list[tuple[RemoteLogSegmentMetadata, LogSegmentData]] = field(default_factory=list)
    #: partition -> the node leading it when the data was tiered
    leaders: dict[int, int] = field(default_factory=dict)
    #: partition -> its COPY_SEGMENT_FINISHED segments, oldest first
    segments: dict[int, list[RemoteLogSegmentMetadata]] = field(default_factory=dict)
    # Where it is, when TieredTopics built it:
    cluster: KafkaCluster | None = None
    root: Path | None = None
    #: the store's and the metadata's configuration keys (strings), the encryption keys' too
    store: dict[str, str] = field(default_factory=dict)
    #: encryption key id -> its file
    keys: dict[str, Path] = field(default_factory=dict)

    def of(self, partition: int) -> list[ProducedRecord]:
        return [r for r in self.records if r.partition == partition]

    def remote(self, partition: int) -> list[ProducedRecord]:
        return [r for r in self.of(partition) if r.offset < self.boundary[partition]]

    def local(self, partition: int) -> list[ProducedRecord]:
        return [r for r in self.of(partition) if r.offset >= self.boundary[partition]]

    def proxy_config(self, **settings: Any) -> Config:
        """A proxy's configuration in front of the cluster, reading this store; `settings` add
        to or replace its keys."""
        assert self.cluster is not None
        return proxy_config(self.cluster.bootstrap_servers, len(self.cluster.brokers), **{**self.store, **settings})

    def proxy(self, **settings: Any) -> AbstractContextManager[ProxyThread]:
        """A proxy with `proxy_config(**settings)`, running."""
        return running(self.proxy_config(**settings))

    def storage(self) -> RemoteStorageManager:
        """A RemoteStorageManager of the test's own over the store (not started: `async with` it)."""
        return remote_storage_manager(parse({"bootstrap.servers": "", **self.store}))


class RecordingCopies:
    """The part of a RemoteStorageManager `tier_log` uses, remembering every copy."""

    def __init__(self, rsm: RemoteStorageManager) -> None:
        self.rsm = rsm
        self.copies: list[tuple[RemoteLogSegmentMetadata, LogSegmentData]] = []

    async def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, segment_data: LogSegmentData) -> None:
        await self.rsm.copy_log_segment_data(metadata, segment_data)
        self.copies.append((metadata, segment_data))


async def raw_log(cluster: Cluster, topics: dict[str, Any], topic: str, partition: int, end: int) -> bytes:
    """The partition's record batches [0, end) from its leader, byte for byte."""
    return await read_log(lambda offset: cluster.fetch_raw(topics, topic, partition, offset, RAW_FETCH_BYTES),
                          f"{topic}-{partition}", 0, end)


async def tier_and_trim(
    bootstrap: str,
    topic: str,
    records: list[ProducedRecord],
    *,
    rsm: RemoteStorageManager,
    rlmm: Any,
    work_dir: Path,
    fraction: float = 0.6,
    partitions: Iterable[int] | None = None,
    segment_bytes: int = 32 * 1024,
    cuts: dict[int, int] | None = None,
    segment_cuts: dict[int, list[int]] | None = None,
    trim: bool = True,
) -> TieredTopic:
    """Tier the first `fraction` of each of `partitions` (default: all) on batch boundaries:
    up to the first batch at or after `cuts[partition]` where given; `segment_cuts[partition]`
    start segments of their own (see `tier_log`). Then (`trim`) advance the broker's log start
    offset to each cut (DeleteRecords).

    `bootstrap` (comma-separated) must let tierproxy's own (PLAINTEXT, unauthenticated)
    connections in.
    """
    recorder = RecordingCopies(rsm)
    segments: dict[int, list[RemoteLogSegmentMetadata]] = {}
    async with Cluster(bootstrap.split(",")) as cluster:
        topics = await cluster.topics([topic])
        info = topics[topic]
        chosen = sorted(info.partitions) if partitions is None else sorted(partitions)
        ends = await cluster.list_offsets(topics, [(topic, p) for p in chosen], OffsetSpec.LATEST)
        boundary = {p: 0 for p in info.partitions}
        for partition in chosen:
            end = ends[(topic, partition)].offset
            log = await raw_log(cluster, topics, topic, partition, end)
            target = (cuts or {}).get(partition, end * fraction)
            cut = next((b for b in iter_batches(log) if b.base_offset >= target), None)
            position, boundary[partition] = (cut.position, cut.base_offset) if cut else (len(log), end)
            segments[partition] = await tier_log(
                log[:position], TopicIdPartition(info.topic_id, topic, partition), rsm=recorder, rlmm=rlmm,
                work_dir=work_dir, segment_bytes=segment_bytes, cut_offsets=(segment_cuts or {}).get(partition, ()))
        if trim:
            wanted = {(topic, p): boundary[p] for p in chosen}
            trimmed = await cluster.delete_records(topics, wanted)
            assert trimmed == wanted, trimmed
    return TieredTopic(topic, info.topic_id, sorted(records, key=lambda r: (r.partition, r.offset)), boundary,
                       recorder.copies, {p: info.partitions[p].leader for p in info.partitions}, segments)


async def upload_again(rsm: RemoteStorageManager, copies: Iterable[tuple[RemoteLogSegmentMetadata, LogSegmentData]]
                       ) -> None:
    """Copy the same segments (same ids, same files) to the store once more."""
    for metadata, segment_data in copies:
        await rsm.copy_log_segment_data(metadata, segment_data)


def local_store(root: Path) -> dict[str, str]:
    """The local-file store and the file metadata store under `root`."""
    return {"remote.log.storage.backend": "local", "remote.log.storage.local.dir": str(root / "remote"),
            "remote.log.metadata.dir": str(root / "metadata")}


def encryption_keys(keys: dict[str, Path]) -> str:
    """`remote.log.storage.encryption.keys` for these key files."""
    return ",".join(f"{key_id}:{path}" for key_id, path in keys.items())


def write_key(path: Path) -> Path:
    """A new random 256-bit key encryption key, base64 in the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    return path


def plaintext_bootstrap(cluster: KafkaCluster) -> str:
    """Where tierproxy's own connections, which speak no SASL, reach the cluster: the client
    listener, or, on a secured cluster, the PLAINTEXT inter-broker listener of node 0 (its
    principal is a super user)."""
    if cluster.client_security_protocol == "PLAINTEXT":
        return cluster.bootstrap_servers
    listeners = read_properties(cluster.workdir / "node-0" / "server.properties")["listeners"]
    (internal,) = [lst for lst in listeners.split(",") if lst.startswith("INTERNAL://")]
    return internal.removeprefix("INTERNAL://")


class TieredTopics:
    """Builds `TopicSpec`s under `root`; `shared`: each (spec, cluster, store) once, kept until
    the cluster stops; otherwise every call builds anew and `delete_all` deletes the topics."""

    def __init__(self, root_factory: Any, *, shared: bool) -> None:
        self._root_factory = root_factory
        self._shared = shared
        self._built: dict[tuple, TieredTopic] = {}

    def __call__(self, spec: TopicSpec, cluster: KafkaCluster, *, s3: S3Server | None = None) -> TieredTopic:
        assert (spec.store == "s3") == (s3 is not None), "an S3 store needs its server, and only it"
        key = (spec, cluster.bootstrap_servers, s3.endpoint_url if s3 is not None else None)
        if key not in self._built or not self._shared:
            self._built[key] = asyncio.run(self._build(spec, cluster, s3))
        return self._built[key]

    def delete_all(self) -> None:
        if not self._shared:
            for built in self._built.values():
                assert built.cluster is not None
                built.cluster.delete_topic(built.topic)
        self._built.clear()

    async def _build(self, spec: TopicSpec, cluster: KafkaCluster, s3: S3Server | None) -> TieredTopic:
        topic = f"tiered-{uuid.uuid4().hex[:8]}"
        root = self._root_factory(topic)
        bootstrap = plaintext_bootstrap(cluster)
        cluster.create_topic(topic, partitions=spec.partitions, replication=spec.replication)
        records, cuts, segment_cuts = await _produce(spec, bootstrap, topic)

        store = dict(local_store(root)) if s3 is None else {
            **s3.storage_properties(topic), "remote.log.metadata.dir": str(root / "metadata")}
        keys = {key_id: write_key(root / "keys" / f"{key_id}.key")
                for key_id in sorted({k for k in spec.encryption if k is not None})}
        if keys:
            store["remote.log.storage.encryption.keys"] = encryption_keys(keys)
        # Partitions copied under the same key (or none) are tiered together.
        tiered = list(range(spec.partitions)) if spec.tier is None else list(spec.tier)
        by_key: dict[str | None, list[int]] = {}
        for partition in tiered:
            by_key.setdefault(spec.encryption[partition] if spec.encryption else None, []).append(partition)
        parts = []
        async with FileRemoteLogMetadataManager(root / "metadata") as rlmm:
            for key_id, partitions in by_key.items():
                config = parse({"bootstrap.servers": bootstrap, **store,
                                "remote.log.storage.encryption.active.key": key_id or ""})
                async with remote_storage_manager(config) as rsm:
                    parts.append(await tier_and_trim(
                        bootstrap, topic, records, rsm=rsm, rlmm=rlmm, work_dir=root / "work",
                        fraction=spec.fraction, partitions=partitions, segment_bytes=spec.segment_bytes,
                        cuts=cuts, segment_cuts=segment_cuts, trim=spec.trim))
        built = parts[0]
        for part in parts[1:]:
            built.boundary.update({p: part.boundary[p] for p in part.segments})
            built.copies += part.copies
            built.segments.update(part.segments)
        built.cluster, built.root, built.store, built.keys = cluster, root, store, keys
        assert all(built.boundary[p] > 0 for p in tiered), f"{topic}: a partition has nothing remote {built.boundary}"
        return built


async def _produce(spec: TopicSpec, bootstrap: str, topic: str
                   ) -> tuple[list[ProducedRecord], dict[int, int], dict[int, list[int]]]:
    """The records produced, the cuts (boundaries) and segment cuts the data set asks for."""
    work = spec.produce
    if isinstance(work, Timed):
        first = int(time.time() * 1000) - work.age_ms
        records = await asyncio.to_thread(
            produce_timed, {"bootstrap.servers": bootstrap}, topic, spec.partitions, work.per_partition,
            value_size=work.value_size, base_timestamp_ms=first, step_ms=work.step_ms,
            timestamps={(p, i): first + shift for p, i, shift in work.outliers})
        return records, {}, {}
    records = await produce_mixed(bootstrap, topic, spec.partitions, per_codec=work.per_codec,
                                  per_transaction=work.per_transaction)
    cuts: dict[int, int] = {}
    if work.split_abort:
        split = await asyncio.to_thread(produce_split_abort, bootstrap, topic)
        records += split
        cuts[0] = sorted(r.offset for r in split)[len(split) // 2]  # the second half's first record
    if work.then_per_codec:
        records += await produce_codecs(bootstrap, topic, spec.partitions, work.then_per_codec)
    await wait_for_markers(bootstrap, topic, spec.partitions)
    segment_cuts: dict[int, list[int]] = {}
    if work.marker_starts_segment:
        segment_cuts[0] = [max(r.offset for r in records if r.partition == 0 and not r.committed) + 1]
    return records, cuts, segment_cuts
