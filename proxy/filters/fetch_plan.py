"""The Fetch filter's decisions that need no I/O: byte budgets, which remote partitions
are read this time, how long a second broker request may wait, and the order of a
merged response. `proxy.filters.fetch` is the async shell that asks the broker and the
remote tier and applies these.

Kafka's rules they follow: a response holds at most `max_bytes`, the remote part at most
`remote.fetch.max.bytes` besides; the first partition with records gets one whole batch
even if it is larger (KIP-74); a Fetch is answered once `min_bytes` are there or `max_wait_ms`
has passed.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import uuid
from collections.abc import Container, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from tierproxy.protocol.fetch_wire import TOPIC_ID_VERSION, ScannedPartition

if TYPE_CHECKING:
    from .tiered_state import PartitionOffsets

__all__ = ("assemble", "broker_part", "first_gets_whole_batch", "proven_below", "remote_budget", "remote_turn",
           "response_order", "second_request", "takes")

_MS = datetime.timedelta(milliseconds=1)

TopicKey = str | uuid.UUID
"""A Fetch names a topic by name before v13 and by topic id from v13."""
Broker = TypeVar("Broker")
Remote = TypeVar("Remote")


def proven_below(offsets: PartitionOffsets | None, fetch_offset: int) -> TypeGuard[PartitionOffsets]:
    """Whether the connection's proof lets the remote tier serve `fetch_offset` without
    asking the broker: a proof younger than OFFSETS_MAX_AGE_S, and the offset below the
    local log start it read."""
    return offsets is not None and not offsets.stale and fetch_offset < offsets.local_log_start


def broker_part(request: Any, served: Container[tuple[TopicKey, int]], by_id: bool) -> Any | None:
    """The Fetch request for the broker without the partitions in `served` (keyed by topic
    id from v13, `by_id`, else by name); None when nothing is left for it."""
    topics = []
    for topic in request.topics:
        key = topic.topic_id if by_id else topic.topic
        partitions = tuple(p for p in topic.partitions if (key, p.partition) not in served)
        if partitions:
            topics.append(dataclasses.replace(topic, partitions=partitions))
    return dataclasses.replace(request, topics=tuple(topics)) if topics else None


def remote_budget(max_bytes: int, broker_bytes: int, remote_max_bytes: int) -> int:
    """Bytes the remote partitions of one response may take: what the broker's records
    left of the request's max_bytes, at most remote.fetch.max.bytes."""
    return min(max(max_bytes - broker_bytes, 0), remote_max_bytes)


def remote_turn(partition_max_bytes: Sequence[int], rotation: int, budget: int) -> tuple[list[int], int]:
    """The remote partitions read this time, as indexes into `partition_max_bytes` in
    reading order, and the rotation the connection's next Fetch starts from.

    Reading starts at `rotation` (modulo the count, so that partitions left out last
    time come first) and takes partitions while what they may return stays under
    `budget`; the first is always read. Needs at least one partition."""
    count = len(partition_max_bytes)
    start = rotation % count
    chosen: list[int] = []
    planned = 0
    for index in itertools.chain(range(start, count), range(start)):
        if chosen and planned >= budget:
            break
        chosen.append(index)
        planned += min(partition_max_bytes[index], budget)
    return chosen, start + len(chosen)


def first_gets_whole_batch(broker_bytes: int, remote_starved: bool) -> bool:
    """KIP-74 for the remote partitions: the first of them with records gets one whole
    batch when no partition of the response had records before them, or when the last Fetch's remote
    partitions got nothing because the broker's records filled the response (a busy
    local tail must not starve remote partitions)."""
    return broker_bytes == 0 or remote_starved


def takes(records_size: int, limit: int, min_one_batch: bool) -> bool:
    """Whether a remote partition's records go into the response: whole batches within
    `limit` (its partition_max_bytes and what is left of the response), or the one whole
    batch KIP-74 grants."""
    return records_size > 0 and (records_size <= limit or min_one_batch)


def second_request(max_wait: datetime.timedelta, elapsed: datetime.timedelta, min_bytes: int,
                   remote_bytes: int) -> tuple[datetime.timedelta, int] | None:
    """(max_wait, min_bytes) of the broker request that waits for the bytes still missing
    once the remote tier gave `remote_bytes`: what is left of the client's wait, in
    whole milliseconds, and at least one byte; None when less than a millisecond is left."""
    left = max_wait - elapsed
    if left < _MS:
        return None
    return left // _MS * _MS, max(min_bytes - remote_bytes, 1)


def response_order(request: Any, broker_topics: Sequence[tuple[TopicKey, Sequence[ScannedPartition]]] | None
                   ) -> list[tuple[TopicKey, list[int]]]:
    """(topic key, partition indexes) in the order a merged response names them: the
    broker's order when it answered the whole request (an incremental response names
    partitions the request omitted), else, `broker_topics` None, the request's."""
    if broker_topics is None:
        by_id = request.__version__ >= TOPIC_ID_VERSION
        return [(t.topic_id if by_id else t.topic, [p.partition for p in t.partitions]) for t in request.topics]
    return [(key, [p.partition_index for p in partitions]) for key, partitions in broker_topics]


def assemble(order: Iterable[tuple[TopicKey, Iterable[int]]], remote: Mapping[tuple[TopicKey, int], Remote],
             broker: Mapping[tuple[TopicKey, int], Broker]) -> list[tuple[TopicKey, list[Remote | Broker]]]:
    """The topics of a merged response: per (topic key, partition indexes) of `order`,
    each partition's remote answer, else the broker's; a partition with neither is left
    out, and so is a topic left with none."""
    topics = []
    for key, indexes in order:
        partitions: list[Remote | Broker] = []
        for index in indexes:
            answer: Remote | Broker | None = remote.get((key, index))
            if answer is None:
                answer = broker.get((key, index))
                if answer is None:
                    continue
            partitions.append(answer)
        if partitions:
            topics.append((key, partitions))
    return topics
