"""Read replicas: topics this cluster serves from another cluster's remote tier only
(`topic.<name>.remote.log.read.replica=true`).

The topic exists on this cluster, empty (`tierproxy replica create`), with the origin's
partition count, so that Metadata, ACLs and consumer groups are this cluster's. Its
records are the origin's remote log: the partition's log start is the remote log start,
its log end (high watermark, last stable offset, and the local log start, since nothing
is local) the remote end offset + 1.

Authorization stays with this cluster's broker: a replica partition of a Fetch goes to it
at an offset beyond any log (`hide_from_broker`), which it answers at once, without
waiting for data, with OFFSET_OUT_OF_RANGE when the client may read the partition and
with its authorization error otherwise. That OFFSET_OUT_OF_RANGE is the proof the Fetch
filter asks of any remote partition, and the broker repeats it in every response of a
fetch session (errors always go back), so sessions need nothing of their own.

The remote log metadata knows the origin's topic id, this cluster another one: the name
joins them (`origin_partition`).

Produce to a replica topic is refused by `ReplicaProduceFilter` and never reaches the
broker; one with acks=0, which gets no response to carry the error, closes the connection.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from kio.static.primitive import i64

from tierproxy.client.queries import ClusterQueries
from tierproxy.protocol.apis import ApiKey, ErrorCode
from tierproxy.protocol.codecs import kio_versions, make_entity, nested_entities, response_schema
from tierproxy.storage.errors import MetadataNotReady
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.model import TopicIdPartition

from ..tiered import RemoteTier
from .chain import CallNext, Filter
from .context import ConnectionContext
from .messages import ClientRequest, RefusedRequest, Response
from .tiered_state import CONNECTION_TOPICS, OFFSETS_MAX_AGE_S, ConnectionTopics, PartitionOffsets, broker_queries

__all__ = ("BEYOND_ANY_LOG", "ReadReplicas", "ReplicaProduceFilter")

#: The fetch offset a replica partition is sent to the broker with: past the end of any
#: log, so that the broker answers OFFSET_OUT_OF_RANGE (after its authorization check) and
#: never parks the Fetch waiting for records the empty topic will not get.
BEYOND_ANY_LOG = 2**62
#: Produce names topics by id from this version on (KIP-516).
_PRODUCE_TOPIC_ID_VERSION = 13


class ReadReplicas:
    """The replica topics of one proxy and where their records are."""

    def __init__(self, names: Iterable[str], rlmm: RemoteLogMetadataManager) -> None:
        self.names = frozenset(names)
        self.rlmm = rlmm
        self._origins: dict[tuple[str, int], TopicIdPartition] = {}
        self._indexed_version: int | None = None  # the metadata's partitions_version it was built at
        self._indexed_loaded = False

    @classmethod
    def of(cls, tier: RemoteTier) -> ReadReplicas:
        return cls((topic.name for topic in tier.config.read_replica_topics), tier.rlmm)

    def __bool__(self) -> bool:
        return bool(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def origin_partition(self, name: str, partition: int) -> TopicIdPartition:
        """The origin's partition of a replica topic in the remote log metadata. Raises
        MetadataNotReady (REPLICA_NOT_AVAILABLE) when the metadata names none: it is still
        loading, or it lacks the topic or that partition (nothing of it tiered yet, another
        bucket or prefix, fewer partitions at the origin). Never an empty log: a consumer
        would take its end, 0, for the partition's and move its committed offsets there."""
        found = self.named_partition(name, partition)
        if found is None:
            raise MetadataNotReady(f"the remote log metadata names no partition {partition} of {name}")
        return found

    def named_partition(self, name: str, partition: int) -> TopicIdPartition | None:
        """As `origin_partition`, but None when the loaded metadata names no such partition."""
        rlmm = self.rlmm
        # Rebuilt when a partition appeared, a delete state changed or the load completed:
        # never per lookup or per segment, whatever the number of partitions.
        if rlmm.partitions_version != self._indexed_version or (not self._indexed_loaded and rlmm.is_loaded()):
            self._indexed_loaded = rlmm.is_loaded()
            self._indexed_version = rlmm.partitions_version
            self._origins = self._index()
        found = self._origins.get((name, partition))
        if found is None and not self._indexed_loaded:
            raise MetadataNotReady(f"remote log metadata is still loading: no origin partition of {name}-{partition} "
                                   f"known yet")
        return found

    def _index(self) -> dict[tuple[str, int], TopicIdPartition]:
        """(name, partition) -> the origin's partition. A topic deleted and created again at
        the origin has two topic ids: the one whose remote log is not deleted is served."""
        ranked: dict[tuple[str, int], tuple[int, TopicIdPartition]] = {}
        for tp in self.rlmm.partitions():
            if tp.topic not in self.names:
                continue
            try:
                rank = 2 if self.rlmm.partition_delete_state(tp) is None else 0
            except MetadataNotReady:
                rank = 1
            key = (tp.topic, tp.partition)
            if key not in ranked or rank >= ranked[key][0]:
                ranked[key] = (rank, tp)
        return {key: tp for key, (_, tp) in ranked.items()}

    def offsets(self, tp: TopicIdPartition) -> PartitionOffsets:
        """The replica partition's offsets: everything is remote. Raises MetadataNotReady."""
        end = self.rlmm.log_end_offset(tp)
        log_end = end + 1 if end is not None else 0
        return PartitionOffsets(log_end, log_end, log_end)

    def log_start(self, tp: TopicIdPartition) -> int:
        start = self.rlmm.log_start_offset(tp)
        return start if start is not None else 0

    async def learn_topic_ids(self, known: ConnectionTopics, queries: ClusterQueries,
                              topic_ids: Iterable[Any]) -> None:
        """Learn this cluster's ids of the replica topics on the connection, when a request
        names ids it does not know (at most once per proof period: an id still unknown then
        is not a replica topic the client may describe)."""
        if all(topic_id in known.topic_names for topic_id in topic_ids):
            return
        now = time.monotonic()
        if now - known.replica_ids_asked_at < OFFSETS_MAX_AGE_S:
            return
        known.replica_ids_asked_at = now
        for name in self.names:
            known.topic_ids.pop(name, None)  # a topic created again has a new id
        await known.known_topic_ids(queries, self.names)

    def is_replica(self, topic_key: Any, by_id: bool, known: ConnectionTopics) -> bool:
        name = known.topic_names.get(topic_key) if by_id else topic_key
        return name in self.names

    def hide_from_broker(self, request: Any, by_id: bool, known: ConnectionTopics) -> Any:
        """The Fetch request with its replica partitions at BEYOND_ANY_LOG; the request
        itself when it has none."""
        topics = []
        changed = False
        for topic in request.topics:
            if self.is_replica(topic.topic_id if by_id else topic.topic, by_id, known):
                changed = True
                topic = dataclasses.replace(topic, partitions=tuple(
                    dataclasses.replace(p, fetch_offset=i64(BEYOND_ANY_LOG)) for p in topic.partitions))
            topics.append(topic)
        return dataclasses.replace(request, topics=tuple(topics)) if changed else request


class ReplicaProduceFilter(Filter):
    """Produce to a replica topic: INVALID_TOPIC_EXCEPTION for its partitions, the rest of
    the request goes to the broker.

    Why that code: it is not retriable, so a producer fails the send at once instead of
    retrying until delivery.timeout.ms, and every client surfaces it as an invalid topic
    (Java's InvalidTopicException, librdkafka's "Broker: Invalid topic"); from v8 the
    partition's error message says the topic is a read replica. POLICY_VIOLATION is
    CreateTopics' code, and an authorization error would send the operator looking at ACLs.
    Kafka's own brokers answer a write to a topic they cannot take (an internal one) so too.

    A Produce with acks=0 gets no response to carry that error: as a broker does with an
    acks=0 Produce it cannot take, the proxy closes the connection (the client sees a
    disconnect and refreshes its metadata) and forwards nothing of it, not even the
    partitions of other topics in it.
    """

    apis = MappingProxyType({ApiKey.PRODUCE: range(kio_versions(ApiKey.PRODUCE).start,
                                                   kio_versions(ApiKey.PRODUCE).stop)})

    def __init__(self, replicas: ReadReplicas, metrics: Any) -> None:
        self.replicas = replicas
        self.metrics = metrics

    async def admit(self, ctx: ConnectionContext, client_request: ClientRequest) -> None:
        refused, by_id, known = await self._replica_topics(ctx, client_request)
        if refused:
            names = ", ".join(str(_name(t, by_id, known) or t.topic_id) for t in refused)
            raise RefusedRequest(f"acks=0 to the read replica topic {names} (client id "
                                 f"{client_request.header.client_id!r}): it takes no writes, and no response "
                                 f"would carry INVALID_TOPIC_EXCEPTION, so the connection closes")

    async def handle(self, ctx: ConnectionContext, client_request: ClientRequest, call_next: CallNext) -> Response:
        request = client_request.body
        refused, by_id, known = await self._replica_topics(ctx, client_request)
        if not refused:
            return await call_next(client_request)
        kept = tuple(t for t in request.topic_data if t not in refused)
        schema = response_schema(ApiKey.PRODUCE, request.__version__)
        entities = nested_entities(schema)
        topics = []
        throttle = None
        if kept:
            answered = (await call_next(client_request.replaced(
                dataclasses.replace(request, topic_data=kept)))).body
            topics.extend(answered.responses)
            throttle = answered.throttle_time
        for topic in refused:
            name = _name(topic, by_id, known)
            partitions = tuple(_refused_partition(entities, p.index, name) for p in topic.partition_data)
            topic_fields = {"topic_id": topic.topic_id} if by_id else {"name": topic.name}
            topics.append(make_entity(entities["TopicProduceResponse"], partition_responses=partitions,
                                      **topic_fields))
        fields = {"responses": tuple(topics)}
        if throttle is not None:
            fields["throttle_time"] = throttle
        return Response.of(make_entity(schema, **fields))

    async def _replica_topics(self, ctx: ConnectionContext, client_request: ClientRequest
                              ) -> tuple[list[Any], bool, ConnectionTopics]:
        """The Produce request's topics that are read replicas; whether it names topics by
        id; the connection's topic names and ids."""
        request = client_request.body
        by_id = request.__version__ >= _PRODUCE_TOPIC_ID_VERSION
        known = CONNECTION_TOPICS.of(ctx)
        if by_id:
            await self.replicas.learn_topic_ids(
                known, broker_queries(ctx, client_request.header.client_id, self.metrics),
                [t.topic_id for t in request.topic_data])
        return [t for t in request.topic_data if self.replicas.is_replica(_key(t, by_id), by_id, known)], by_id, known


def _key(topic: Any, by_id: bool) -> Any:
    return topic.topic_id if by_id else topic.name


def _name(topic: Any, by_id: bool, known: ConnectionTopics) -> str | None:
    return known.topic_names.get(topic.topic_id) if by_id else topic.name


def _refused_partition(entities: Mapping[str, type], index: int, name: str | None) -> Any:
    return make_entity(entities["PartitionProduceResponse"], index=index, error_code=ErrorCode.invalid_topic_exception,
                       base_offset=i64(-1), record_errors=(),
                       error_message=f"{name} is a read replica of a remote log: it takes no writes")
