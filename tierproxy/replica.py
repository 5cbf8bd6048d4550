"""`tierproxy replica create`: the read replica topics of a configuration
(`topic.<name>.remote.log.read.replica=true`), created on this cluster, empty.

Each gets the origin's partition count, so that this cluster's Metadata, ACLs and consumer
groups fit the remote log partition for partition: the count the origin's pipeline
publishes with the remote log metadata into the store (the origin cluster's metadata, every
partition, tiered yet or not), whatever remote log metadata backend the file names. A store
whose metadata was published before those counts were has none: then the partitions the
remote log metadata knows of the topic (the highest + 1) stand in, and a warning says so.

Idempotent: a topic that exists with that count is fine; one with fewer partitions gets the
missing ones (CreatePartitions: Kafka adds partitions, never removes them, so the topic and
its consumer groups' offsets stay); one with more than the origin's published count is an
error naming both. Each topic is done on its own: one that fails leaves the others done.
A topic created or grown is waited for until this cluster's metadata shows its partitions
(a broker learns of a new topic a moment after the controller made it).

The topic takes no writes even from a client that bypasses the proxy: it is created
with `max.message.bytes=0`, which every record batch exceeds.

Exit status: 0 when every replica topic exists as it should, 1 otherwise, 2 for a
configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.errors import KafkaError

from tierproxy.client.security import aiokafka_options
from tierproxy.config import BOOTSTRAP_SERVERS, Config, ConfigError, load
from tierproxy.storage.errors import RemoteLogMetadataError, RemoteStorageError
from tierproxy.storage.factory import remote_log_metadata_manager, remote_storage_manager
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.metadata.bucket import BucketMetadata
from tierproxy.storage.rsm import RemoteStorageManager

#: Kafka's TOPIC_ALREADY_EXISTS: another `replica create` was quicker.
_TOPIC_ALREADY_EXISTS = 36
#: Replica topics never hold a record (see above).
REPLICA_TOPIC_CONFIG = {"max.message.bytes": "0"}
#: How long a topic created or grown may take to show in this cluster's metadata.
METADATA_WAIT_S = 30.0
_METADATA_RETRY_S = 0.1


class ReplicaError(Exception):
    """A replica topic cannot be made to fit its remote log."""


@dataclass(frozen=True, slots=True)
class OriginPartitions:
    """Replica topic -> the origin's partition count; `from_metadata`: the topics the store
    publishes no count of, counted from the partitions their remote log metadata knows."""

    counts: dict[str, int]
    from_metadata: frozenset[str] = frozenset()

    def warnings(self) -> list[str]:
        return [f"{name}: the remote store publishes no partition count of the origin's topic (a pipeline "
                f"before this version published its metadata): {self.counts[name]}, the partitions its remote "
                "log metadata knows, stands in; partitions the origin has not tiered yet are not counted, run "
                "this again after the origin's next tiering pass"
                for name in sorted(self.from_metadata)]


async def published_partition_counts(rsm: RemoteStorageManager) -> Mapping[str, int]:
    """The origin's partition counts its pipeline published with the remote log metadata
    into `rsm`; empty when nothing was published, or by a pipeline before the counts were."""
    head = await BucketMetadata(rsm).head()
    return (head.topic_partitions or {}) if head is not None else {}


def known_partition_counts(rlmm: RemoteLogMetadataManager, names: Collection[str]) -> dict[str, int]:
    """Topic of `names` -> the partitions its remote log metadata knows (the highest + 1)."""
    counts: dict[str, int] = {}
    for tp in rlmm.partitions():
        if tp.topic in names:
            counts[tp.topic] = max(counts.get(tp.topic, 0), tp.partition + 1)
    return counts


async def origin_partition_counts(config: Config) -> OriginPartitions:
    """The origin's partition count of each replica topic: as published into the store, else
    as its remote log metadata knows it (the metadata manager is read only then)."""
    names = {topic.name for topic in config.read_replica_topics}
    try:
        async with remote_storage_manager(config) as rsm:
            published = await published_partition_counts(rsm)
    except (RemoteStorageError, RemoteLogMetadataError) as e:
        raise ReplicaError(f"cannot read the remote log metadata published into the remote store: {e}") from e
    counts = {name: published[name] for name in names if name in published}
    rest = names - set(counts)
    if not rest:
        return OriginPartitions(counts)
    async with remote_log_metadata_manager(config, read_only=True) as rlmm:
        known = known_partition_counts(rlmm, rest)
        problem = rlmm.problem
    missing = sorted(rest - set(known))
    if missing:
        why = str(problem) if problem is not None else (
            "nothing of it is tiered yet, or remote.log.metadata.* name another store than the origin's")
        raise ReplicaError(f"no remote log metadata of {', '.join(missing)}: {why}")
    return OriginPartitions(counts | known, frozenset(known))


@dataclass(slots=True)
class Outcome:
    """Per topic what was done (`lines`), or why it could not be (`errors`)."""

    lines: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


async def create_replica_topics(config: Config) -> Outcome:
    """Creates the missing replica topics and adds the missing partitions of those with fewer
    than the origin's."""
    origin = await origin_partition_counts(config)
    counts = origin.counts
    outcome = Outcome(warnings=origin.warnings())
    admin = AIOKafkaAdminClient(bootstrap_servers=",".join(config[BOOTSTRAP_SERVERS]), client_id="tierproxy-replica",
                                **aiokafka_options(config))
    await admin.start()
    try:
        existing = await _partition_counts(admin, list(counts))
        missing, fewer = [], []
        for name, count in sorted(counts.items()):
            have = existing.get(name)
            if have is None:
                missing.append(name)
            elif have < count:
                fewer.append(name)
            elif have > count and name not in origin.from_metadata:
                outcome.errors[name] = (
                    f"{name} exists on this cluster with {have} partitions, more than the origin's {count}: Kafka "
                    f"removes no partition, and partitions {count}-{have - 1} have no remote log; to match, delete "
                    "the topic (its consumer groups' offsets go with it) and run this again")
            else:
                outcome.lines[name] = f"{name}: exists with {have} partitions"
        if missing:
            replication = min(3, len((await admin.describe_cluster())["brokers"]))
            response = await admin.create_topics([NewTopic(name, counts[name], replication,
                                                           topic_configs=REPLICA_TOPIC_CONFIG) for name in missing])
            for name, code, *message in response.topic_errors:
                if code not in (0, _TOPIC_ALREADY_EXISTS):
                    outcome.errors[name] = f"cannot create {name}: error {code} {message}"
        for name in fewer:
            try:
                await admin.create_partitions({name: NewPartitions(counts[name])})
            except KafkaError as e:
                outcome.errors[name] = (f"cannot add partitions {existing[name]}-{counts[name] - 1} to {name} "
                                        f"({existing[name]} partitions, the origin's {counts[name]}): {e}")
        done = [name for name in missing + fewer if name not in outcome.errors]
        shown = await _wait_for_partition_counts(admin, {name: counts[name] for name in done})
        for name in done:
            if shown.get(name) != counts[name]:
                outcome.errors[name] = (f"{name} shows {shown.get(name)} partitions in this cluster's metadata "
                                        f"{METADATA_WAIT_S:.0f}s after it was made, not {counts[name]}")
            elif name in existing:
                outcome.lines[name] = (f"{name}: {counts[name] - existing[name]} partitions added to its "
                                       f"{existing[name]}: {counts[name]}, the origin's")
            else:
                outcome.lines[name] = f"{name}: created with {counts[name]} partitions"
        return outcome
    finally:
        await admin.close()


async def _wait_for_partition_counts(admin: AIOKafkaAdminClient, wanted: Mapping[str, int]) -> dict[str, int]:
    """The partition counts of `wanted`'s topics once this cluster's metadata shows each
    with its wanted count, or as it shows them after METADATA_WAIT_S."""
    deadline = asyncio.get_running_loop().time() + METADATA_WAIT_S
    while True:
        shown = await _partition_counts(admin, list(wanted))
        if all(shown.get(name) == count for name, count in wanted.items()) or \
                asyncio.get_running_loop().time() >= deadline:
            return shown
        await asyncio.sleep(_METADATA_RETRY_S)


async def _partition_counts(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """Topic -> partitions, for the topics of `names` that exist (listing, not describing:
    a Metadata request naming a missing topic may auto-create it)."""
    if not names:
        return {}
    listed = set(await admin.list_topics())
    wanted = [name for name in names if name in listed]
    if not wanted:
        return {}
    described: list[dict[str, Any]] = await admin.describe_topics(wanted)
    return {t["topic"]: len(t["partitions"]) for t in described if t["error_code"] == 0}


def run(args: argparse.Namespace) -> int:
    try:
        config = load(args.config, args.override)
        if not config.read_replica_topics:
            raise ConfigError("no topic.<name>.remote.log.read.replica=true in the configuration: "
                              "no replica topic to create")
        outcome = asyncio.run(create_replica_topics(config))
    except ConfigError as e:
        print(f"tierproxy replica: {e}", file=sys.stderr)
        return 2
    except (ReplicaError, KafkaError) as e:
        print(f"tierproxy replica: {e}", file=sys.stderr)
        return 1
    for warning in outcome.warnings:
        print(f"tierproxy replica: warning: {warning}", file=sys.stderr)
    for name in sorted(outcome.lines):
        print(outcome.lines[name])
    for name in sorted(outcome.errors):
        print(f"tierproxy replica: {outcome.errors[name]}", file=sys.stderr)
    return 1 if outcome.errors else 0
