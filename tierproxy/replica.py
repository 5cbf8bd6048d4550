"""`tierproxy replica create`: the read replica topics of a configuration
(`topic.<name>.remote.log.read.replica=true`), created on this cluster, empty.

Each gets the origin's partition count, the partitions the remote log metadata (the
backend the file names) knows of the topic, so that this cluster's Metadata, ACLs and
consumer groups fit the remote log partition for partition. Idempotent: a topic that
exists with that count is fine, one with another count is an error naming both.

The topic takes no writes even from a client that bypasses the proxy: it is created
with `max.message.bytes=0`, which every record batch exceeds.

Exit status: 0 when every replica topic exists as it should, 1 otherwise, 2 for a
configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tierproxy.client.security import aiokafka_options
from tierproxy.config import BOOTSTRAP_SERVERS, Config, ConfigError, load
from tierproxy.storage.factory import remote_log_metadata_manager

#: Kafka's TOPIC_ALREADY_EXISTS: another `replica create` was quicker.
_TOPIC_ALREADY_EXISTS = 36
#: Replica topics never hold a record (see above).
REPLICA_TOPIC_CONFIG = {"max.message.bytes": "0"}


class ReplicaError(Exception):
    """A replica topic cannot be made to fit its remote log."""


async def origin_partition_counts(config: Config) -> dict[str, int]:
    """Replica topic -> the partitions its remote log metadata knows (the highest + 1)."""
    names = {topic.name for topic in config.read_replica_topics}
    counts: dict[str, int] = {}
    async with remote_log_metadata_manager(config, read_only=True) as rlmm:
        for tp in rlmm.partitions():
            if tp.topic in names:
                counts[tp.topic] = max(counts.get(tp.topic, 0), tp.partition + 1)
    missing = sorted(names - set(counts))
    if missing:
        raise ReplicaError(f"no remote log metadata of {', '.join(missing)}: nothing of it is tiered yet, or "
                           f"remote.log.metadata.* name another store than the origin's")
    return counts


async def create_replica_topics(config: Config) -> list[str]:
    """Create the missing replica topics; one line per topic saying what was done."""
    counts = await origin_partition_counts(config)
    admin = AIOKafkaAdminClient(bootstrap_servers=",".join(config[BOOTSTRAP_SERVERS]), client_id="tierproxy-replica",
                                **aiokafka_options(config))
    await admin.start()
    try:
        existing = await _partition_counts(admin, list(counts))
        lines = []
        missing = []
        for name, count in sorted(counts.items()):
            have = existing.get(name)
            if have is None:
                missing.append(name)
            elif have != count:
                raise ReplicaError(f"{name} exists on this cluster with {have} partitions; its remote log has "
                                   f"{count}: delete it (it holds nothing a replica needs) and create it again")
            else:
                lines.append(f"{name}: exists with {count} partitions")
        if missing:
            replication = min(3, len((await admin.describe_cluster())["brokers"]))
            response = await admin.create_topics([NewTopic(name, counts[name], replication,
                                                           topic_configs=REPLICA_TOPIC_CONFIG) for name in missing])
            for name, code, *message in response.topic_errors:
                if code not in (0, _TOPIC_ALREADY_EXISTS):
                    raise ReplicaError(f"cannot create {name}: error {code} {message}")
            created = await _partition_counts(admin, missing)
            for name in missing:
                if created.get(name) != counts[name]:
                    raise ReplicaError(f"{name} has {created.get(name)} partitions after creation, not {counts[name]}")
                lines.append(f"{name}: created with {counts[name]} partitions")
        return lines
    finally:
        await admin.close()


async def _partition_counts(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """Topic -> partitions, for the topics of `names` that exist (listing, not describing:
    a Metadata request naming a missing topic may auto-create it)."""
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
    except ConfigError as e:
        print(f"tierproxy replica: {e}", file=sys.stderr)
        return 2
    try:
        for line in asyncio.run(create_replica_topics(config)):
            print(line)
    except ReplicaError as e:
        print(f"tierproxy replica: {e}", file=sys.stderr)
        return 1
    return 0
