"""Remote storage turned off for a topic that has remote data (KIP-950).

A topic of the cluster whose remote log metadata still holds segments, but which the
configuration no longer tiers (`topic.<name>.remote.storage.enable=false`, or not named
at all: false is the default), had its remote storage turned off. Kafka accepts that
only with `remote.log.delete.on.disable=true`, and then deletes the topic's remote data:
here each of its partitions goes as partition removal takes the partitions of a deleted
topic (`partition_remover.remove_partition`: DELETE_PARTITION_MARKED -> STARTED -> every
segment and object deleted -> FINISHED), after which the proxy serves none of it.
Without it the change is refused with Kafka's own message (`LogConfig`'s
`validateTurningOffRemoteStorageWithDelete`): nothing is deleted, the remote data stays
served, and the rest of the pass goes on.

To stop copying but keep serving what is remote, Kafka's way is
`remote.storage.enable=true` with `remote.log.copy.disable=true` (`pipeline.plan`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tierproxy.client.cluster import Cluster
from tierproxy.config import Config
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.model import RemotePartitionDeleteState, TopicIdPartition
from tierproxy.storage.rsm import RemoteStorageManager

from .failures import log_failure
from .local_retention import METADATA_READY_TIMEOUT_S
from .partition_remover import PartitionRemoval, remove_partition

log = logging.getLogger(__name__)

# Kafka's message, word for word.
DISABLE_WITHOUT_DELETE = (
    "It is invalid to disable remote storage without deleting remote data. "
    "If you want to keep the remote data and turn to read only, please set "
    "`remote.storage.enable=true,remote.log.copy.disable=true`. "
    "If you want to disable remote storage and delete all remote data, please set "
    "`remote.storage.enable=false,remote.log.delete.on.disable=true`."
)


@dataclass(slots=True)
class RemoteStorageDisableResult:
    removed: list[PartitionRemoval] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (topic, error)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (partition, error)


async def apply_remote_storage_disable(
    config: Config, cluster: Cluster, rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager
) -> RemoteStorageDisableResult:
    """Deletes the remote data of every topic turned off with remote.log.delete.on.disable;
    refuses (reports) every topic turned off without it."""
    result = RemoteStorageDisableResult()
    tiered = {t.name for t in config.tiered_topics}
    live = {info.topic_id: name for name, info in (await cluster.topics(None)).items()}
    turned_off: dict[str, list[TopicIdPartition]] = {}
    for tp in rlmm.partitions():
        name = live.get(tp.topic_id)
        if name is None or name in tiered:
            continue  # a deleted topic (the partition remover's), or one still tiered
        await rlmm.wait_until_ready(tp, METADATA_READY_TIMEOUT_S)
        if rlmm.partition_delete_state(tp) != RemotePartitionDeleteState.DELETE_PARTITION_FINISHED \
                and rlmm.list_segments(tp):
            turned_off.setdefault(name, []).append(tp)

    for name, tps in sorted(turned_off.items()):
        if not config.topic(name).remote_log_delete_on_disable:
            error = f"topic.{name}.remote.storage.enable=false: {DISABLE_WITHOUT_DELETE}"
            log.error("%s", error)
            result.refused.append((name, error))
            continue
        for tp in sorted(tps, key=lambda t: t.partition):
            try:
                result.removed.append(await remove_partition(rlmm, rsm, tp))
            except Exception as e:  # one partition's failure must not stop the others
                result.failures.append((str(tp), log_failure(log, logging.WARNING, f"deleting remote data of {tp}", e)))
        log.info("remote storage of %s turned off: its remote data is deleted (remote.log.delete.on.disable)", name)
    return result
