"""OffsetForLeaderEpoch for read replica topics: the end offsets of the origin's leader epochs.

A replica topic's records carry the origin's partition leader epochs. A consumer checks its
position with them (after a restart from a committed offset, after a leader change): it asks
for the end offset of the epoch its position came from, and takes an answer below its
position for a truncated log. The replica cluster's topic is empty, so its broker's answer
(end offset 0, or none) would send every such consumer back or to auto.offset.reset.

The request still goes to the broker as it is, so that its authorization and its fencing of
the current leader epoch (this cluster's, from its Metadata) apply, and any error it answers
stays. Where it answered a replica partition without error, the leader epoch and end offset
are the remote log's (`RemoteLogMetadataManager.end_offset_for_epoch`, Kafka's rules), or
REPLICA_NOT_AVAILABLE while the remote log metadata does not name the partition. The
request names topics by name only. A follower's request (replica_id >= 0) is none of the
proxy's.
"""

from __future__ import annotations

import dataclasses
import uuid
from types import MappingProxyType
from typing import Any

from kio.static.primitive import i32, i64

from tierproxy.protocol.apis import ApiKey, ErrorCode
from tierproxy.protocol.codecs import INTERCEPTED
from tierproxy.storage.errors import MetadataNotReady
from tierproxy.storage.metadata.lineage import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from tierproxy.storage.model import TopicIdPartition

from ..tiered import RemoteTier
from .chain import CallNext, Filter
from .context import ConnectionContext
from .messages import ClientRequest, Response
from .replica import ReadReplicas

__all__ = ("OffsetForLeaderEpochFilter",)

_API = "OFFSET_FOR_LEADER_EPOCH"
#: The answer's fields when no epoch is known (Kafka's UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET).
_UNKNOWN_EPOCH = {"leader_epoch": i32(UNDEFINED_EPOCH), "end_offset": i64(UNDEFINED_EPOCH_OFFSET)}


class OffsetForLeaderEpochFilter(Filter):
    apis = MappingProxyType({ApiKey.OFFSET_FOR_LEADER_EPOCH: INTERCEPTED[ApiKey.OFFSET_FOR_LEADER_EPOCH]})

    def __init__(self, tier: RemoteTier, replicas: ReadReplicas) -> None:
        self.tier = tier
        self.replicas = replicas

    async def handle(self, ctx: ConnectionContext, client_request: ClientRequest, call_next: CallNext) -> Response:
        request = client_request.body
        # v2 has no replica_id: a consumer's (followers send their broker id from v3 on).
        if getattr(request, "replica_id", -1) >= 0 or not any(t.topic in self.replicas for t in request.topics):
            return await call_next(client_request)
        asked = {(t.topic, p.partition): p.leader_epoch for t in request.topics if t.topic in self.replicas
                 for p in t.partitions}
        response = (await call_next(client_request)).body
        topics = tuple(
            dataclasses.replace(t, partitions=tuple(self._answer(t.topic, p, asked) for p in t.partitions))
            if t.topic in self.replicas else t
            for t in response.topics)
        return Response.of(dataclasses.replace(response, topics=topics))

    def _answer(self, topic: str, broker: Any, asked: dict[tuple[str, int], int]) -> Any:
        """The broker's answer for a partition, with the remote log's epoch and end offset when
        the broker saw no error in it."""
        requested = asked.get((topic, broker.partition))
        if broker.error_code != ErrorCode.none or requested is None:
            return broker
        tp: TopicIdPartition | None = None
        try:
            tp = self.replicas.origin_partition(topic, broker.partition)
            epoch, end_offset = self.replicas.rlmm.end_offset_for_epoch(tp, requested)
        except MetadataNotReady as e:  # REPLICA_NOT_AVAILABLE: the consumer asks again
            # This API names topics only: the log line and the count need no id.
            code = self.tier.error_code_for(tp or TopicIdPartition(uuid.UUID(int=0), topic, broker.partition), e, _API)
            return dataclasses.replace(broker, error_code=code, **_UNKNOWN_EPOCH)
        return dataclasses.replace(broker, leader_epoch=i32(epoch), end_offset=i64(end_offset))
