"""ListOffsets over the whole log, remote part included.

| timestamp | answer |
|---|---|
| -1 LATEST (v1+) | the broker's |
| -2 EARLIEST (v1+) | the remote log start when remote data exists, else the broker's |
| -3 MAX_TIMESTAMP (v7+) | the larger of the broker's and the remote maximum |
| -4 EARLIEST_LOCAL_TIMESTAMP (v8+) | the broker's local log start (its -4, or its -2 if older), timestamp -1 |
| -5 LATEST_TIERED_TIMESTAMP (v9+) | the highest remote offset, -1 when nothing is remote |
| >= 0 | the first remote record at or after it when the remote log has one, else the broker's |

A read replica topic (`replica`) is all remote: its log end (-1, and -4 since nothing is
local) is the remote end offset + 1, its log start (-2) the remote log start, -3, -5 and
timestamps are the remote log's, leader epochs -1 (the origin's mean nothing to this
cluster), whatever the broker says of the empty topic; REPLICA_NOT_AVAILABLE while the
remote log metadata does not name the partition (never the empty topic's 0).

Every partition still goes to the broker (on the client's connection) so that its
authorization and errors apply; -5 is sent as -2 for that. A special timestamp below
its minimum version gets UNSUPPORTED_VERSION for that partition, as Kafka does. The
proxy advertises ListOffsets up to v9 even to an older broker and sends the broker
the highest version it supports, translating -4 into -2.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Awaitable
from types import MappingProxyType
from typing import Any, TypeVar

from kio.static.primitive import i32, i64

from tierproxy.protocol.apis import ApiKey, ErrorCode, OffsetSpec
from tierproxy.protocol.codecs import INTERCEPTED, make_entity, nested_entities
from tierproxy.protocol.codecs import request_schema, response_schema
from tierproxy.storage.errors import MetadataNotReady, RemoteStorageError
from tierproxy.storage.model import TopicIdPartition
from tierproxy.remote_log.reader_pool import ReadOutcome

from ..tiered import RemoteTier
from .chain import CallNext, Filter
from .context import ConnectionContext
from .messages import ClientRequest, Response
from .replica import ReadReplicas
from .tiered_state import CONNECTION_TOPICS, broker_queries

log = logging.getLogger("tierproxy.list_offsets")

# The version that first allows -5; advertised even when the broker stops below it.
_TIERED_VERSION = OffsetSpec.LATEST_TIERED_TIMESTAMP.min_version
T = TypeVar("T")


class ListOffsetsFilter(Filter):
    apis = MappingProxyType({ApiKey.LIST_OFFSETS: INTERCEPTED[ApiKey.LIST_OFFSETS]})

    def __init__(self, tier: RemoteTier) -> None:
        self.tier = tier
        self.replicas = ReadReplicas.of(tier)

    def advertised_versions(self, api_key: int, broker_min: int, broker_max: int) -> tuple[int, int]:
        versions = self.apis[api_key]
        return max(broker_min, versions.start), min(max(broker_max, _TIERED_VERSION), versions.stop - 1)

    async def handle(self, ctx: ConnectionContext, client_request: ClientRequest, call_next: CallNext) -> Response:
        version = client_request.api_version
        request = client_request.body
        broker_max = ctx.broker_api_versions.get(ApiKey.LIST_OFFSETS, (0, version))[1]
        send_version = min(version, broker_max)

        unsupported: set[tuple[str, int]] = set()
        asked: dict[tuple[str, int], int] = {}
        topics = []
        for topic in request.topics:
            partitions = []
            for partition in topic.partitions:
                spec = partition.timestamp
                key = (topic.name, partition.partition_index)
                if spec < 0 and not _allowed(spec, version):
                    unsupported.add(key)
                    continue
                asked[key] = spec
                partitions.append(dataclasses.replace(partition, timestamp=i64(_for_broker(spec, send_version))))
            if partitions:
                topics.append(dataclasses.replace(topic, partitions=tuple(partitions)))

        remote_names = {tp.topic for tp in self.tier.rlmm.partitions()}
        needs_remote = any(
            name in remote_names and spec != OffsetSpec.LATEST for (name, _), spec in asked.items()
        ) or any(name in self.replicas for name, _ in asked)
        if not unsupported and not needs_remote and send_version == version and not _translated(asked, send_version):
            return await call_next(client_request)  # nothing for the proxy to add

        answers: dict[tuple[str, int], Any] = {}
        if topics:
            forwarded = _convert(request_schema(ApiKey.LIST_OFFSETS, send_version), request, topics=tuple(topics))
            response = (await call_next(client_request.replaced(forwarded))).body
            answers = {(t.name, p.partition_index): p for t in response.topics for p in t.partitions}
        topic_ids: dict[str, Any] = {}
        tiered_names = {name for name, _ in asked if name in remote_names and name not in self.replicas}
        if needs_remote and tiered_names:
            queries = broker_queries(ctx, client_request.header.client_id, self.tier.metrics)
            topic_ids = await CONNECTION_TOPICS.of(ctx).known_topic_ids(queries, tiered_names)

        schema = response_schema(ApiKey.LIST_OFFSETS, version)
        entities = nested_entities(schema)
        out_topics = []
        for topic in request.topics:
            partitions = []
            for partition in topic.partitions:
                key = (topic.name, partition.partition_index)
                if key in unsupported:
                    answer = dict(error_code=ErrorCode.unsupported_version)
                    self.tier.metrics.partition_error("LIST_OFFSETS", ErrorCode.unsupported_version)
                else:
                    answer = await self._answer(key, asked[key], answers.get(key), topic_ids.get(topic.name))
                partitions.append(
                    make_entity(entities["ListOffsetsPartitionResponse"], partition_index=partition.partition_index,
                                **_typed(answer))
                )
            out_topics.append(make_entity(entities["ListOffsetsTopicResponse"], name=topic.name,
                                          partitions=tuple(partitions)))
        return Response.of(make_entity(schema, throttle_time=datetime.timedelta(0), topics=tuple(out_topics)))

    async def _answer(self, key: tuple[str, int], spec: int, broker: Any, topic_id: Any) -> dict[str, Any]:
        if broker is None:
            return dict(error_code=ErrorCode.unknown_server_error)
        answer = dict(error_code=broker.error_code, timestamp=broker.timestamp, offset=broker.offset,
                      leader_epoch=getattr(broker, "leader_epoch", -1))
        if broker.error_code != ErrorCode.none:
            return answer
        if key[0] in self.replicas:
            try:
                origin = self.replicas.origin_partition(*key)
            except MetadataNotReady as e:
                return dict(error_code=self.tier.error_code_for(TopicIdPartition(topic_id, *key), e, "LIST_OFFSETS"))
            return await self._guarded(origin, self._replica(origin, spec, answer))
        if spec == OffsetSpec.EARLIEST_LOCAL_TIMESTAMP:
            answer["timestamp"] = -1
        if spec == OffsetSpec.LATEST or spec == OffsetSpec.EARLIEST_LOCAL_TIMESTAMP:
            return answer
        tp = TopicIdPartition(topic_id, key[0], key[1]) if topic_id is not None else None
        if tp is None:
            if spec == OffsetSpec.LATEST_TIERED_TIMESTAMP:
                answer.update(timestamp=-1, offset=-1, leader_epoch=-1)
            return answer
        return await self._guarded(tp, self._tiered(tp, spec, answer, broker))

    async def _guarded(self, tp: TopicIdPartition, lookup: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        """The answer of a remote lookup, or the error code a failed one stands for."""
        try:
            return await lookup
        except (MetadataNotReady, RemoteStorageError) as e:
            return dict(error_code=self.tier.error_code_for(tp, e, "LIST_OFFSETS"))
        except _Expired:
            self.tier.metrics.partition_error("LIST_OFFSETS", ErrorCode.request_timed_out)
            return dict(error_code=ErrorCode.request_timed_out)  # remote.list.offsets.request.timeout.ms

    async def _replica(self, tp: TopicIdPartition, spec: int, answer: dict[str, Any]) -> dict[str, Any]:
        """A read replica partition's answer, from the remote log alone."""
        answer.update(leader_epoch=-1)
        log_end = self.replicas.offsets(tp).high_watermark
        found = None
        if spec in (OffsetSpec.LATEST, OffsetSpec.EARLIEST_LOCAL_TIMESTAMP):
            return {**answer, "timestamp": -1, "offset": log_end}
        if spec == OffsetSpec.EARLIEST:
            return {**answer, "timestamp": -1, "offset": self.replicas.log_start(tp)}
        if spec == OffsetSpec.LATEST_TIERED_TIMESTAMP:
            return {**answer, "timestamp": -1, "offset": log_end - 1 if log_end else -1}
        if spec == OffsetSpec.MAX_TIMESTAMP:
            found = _value(await self.tier.engine.max_timestamp(tp))
        elif spec >= 0:
            found = _value(await self.tier.engine.offset_for_timestamp(tp, spec))
        if found is None:  # Kafka's answer for no such record
            return {**answer, "timestamp": -1, "offset": -1}
        return {**answer, "timestamp": found.timestamp, "offset": found.offset}

    async def _tiered(self, tp: TopicIdPartition, spec: int, answer: dict[str, Any], broker: Any) -> dict[str, Any]:
        """A tiered partition's answer: the broker's, or the remote log's where it goes further."""
        engine = self.tier.engine
        if spec == OffsetSpec.EARLIEST:
            remote = _value(await engine.earliest_remote_offset(tp))
            if remote is not None and remote.offset < broker.offset:
                answer.update(timestamp=-1, offset=remote.offset, leader_epoch=remote.leader_epoch)
        elif spec == OffsetSpec.LATEST_TIERED_TIMESTAMP:
            remote = _value(await engine.latest_tiered_offset(tp))
            answer.update(timestamp=-1, offset=remote.offset if remote else -1,
                          leader_epoch=remote.leader_epoch if remote else -1)
        elif spec == OffsetSpec.MAX_TIMESTAMP:
            found = _value(await engine.max_timestamp(tp))
            if found is not None and found.timestamp > broker.timestamp:
                answer.update(timestamp=found.timestamp, offset=found.offset, leader_epoch=found.leader_epoch)
        elif spec >= 0:
            found = _value(await engine.offset_for_timestamp(tp, spec))
            if found is not None and (broker.offset < 0 or found.offset < broker.offset):
                answer.update(timestamp=found.timestamp, offset=found.offset, leader_epoch=found.leader_epoch)
        return answer


class _Expired(Exception):
    """A remote lookup ran out of remote.list.offsets.request.timeout.ms."""


def _value(outcome: ReadOutcome[T]) -> T | None:
    """The outcome's value; its error raised, or _Expired."""
    if outcome.expired:
        raise _Expired
    if outcome.error is not None:
        raise outcome.error
    return outcome.value


def _allowed(spec: int, version: int) -> bool:
    try:
        return OffsetSpec(spec).min_version <= version
    except ValueError:
        return True  # other negative timestamps: the broker decides


def _for_broker(spec: int, version: int) -> int:
    if spec == OffsetSpec.LATEST_TIERED_TIMESTAMP:
        return OffsetSpec.EARLIEST  # only the broker's authorization matters
    if spec == OffsetSpec.EARLIEST_LOCAL_TIMESTAMP and not _allowed(spec, version):
        return OffsetSpec.EARLIEST  # an older broker's -2 is its local log start
    return spec


def _translated(asked: dict[tuple[str, int], int], version: int) -> bool:
    return any(_for_broker(spec, version) != spec for spec in asked.values())


def _convert(schema: type, entity: Any, **changes: Any) -> Any:
    """`entity` as another version of its schema (fields that version lacks are dropped)."""
    entities = nested_entities(schema)
    values = {f.name: getattr(entity, f.name) for f in dataclasses.fields(entity)}
    values.update(changes)
    if "topics" in values:
        values["topics"] = tuple(
            make_entity(entities["ListOffsetsTopic"], name=t.name, partitions=tuple(
                make_entity(entities["ListOffsetsPartition"], **{f.name: getattr(p, f.name) for f in dataclasses.fields(p)})
                for p in t.partitions))
            for t in values["topics"]
        )
    values.setdefault("replica_id", i32(-1))
    values.setdefault("timeout", datetime.timedelta(0))
    return make_entity(schema, **values)


def _typed(answer: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"error_code": ErrorCode(answer["error_code"])}
    for name, cast in (("timestamp", i64), ("offset", i64), ("leader_epoch", i32)):
        if name in answer:
            out[name] = cast(answer[name])
    return out
