"""Requests the Fetch and ListOffsets handlers send on the client's own upstream
connection, so the broker checks them against the client's identity and ACLs: topic
ids (Metadata), log start, high watermark and last stable offset (ListOffsets), and
aborted transactions at the local log start (a READ_COMMITTED Fetch).

What they learn is kept per connection (`TierConnectionState`), never shared between
clients: the broker's OFFSET_OUT_OF_RANGE on this connection is the proof that lets
remote data be served on it. They carry the client's client id (quotas stay the
client's) but correlation ids of the proxy's own, counting down from -1, so that in
the broker's request log they never pass for one of the client's requests. Versions used (Metadata v12, ListOffsets v7, Fetch v12)
are accepted by every Kafka 3.x and 4.x broker.
"""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass, field

from tierproxy.protocol.apis import ErrorCode, OffsetSpec
from tierproxy.protocol.codecs import decode_response, encode_request
from tierproxy.protocol.requests import READ_COMMITTED, fetch_request, list_offsets_request, metadata_request
from tierproxy.protocol.headers import RequestHeader
from tierproxy.remote_log.metrics import RemoteMetrics

from ..metrics import api_name
from . import Forward
from .fetch_session import FetchSessionPositions

# How long a proof (OFFSET_OUT_OF_RANGE below the local log start) and the offsets read
# with it let fetches of the partition skip the broker; then the broker is asked again,
# so that READ taken away and a moved high watermark apply within this time.
OFFSETS_MAX_AGE_S = 1.0


@dataclass(slots=True)
class PartitionOffsets:
    """What the broker said of one partition on this connection."""

    local_log_start: int
    high_watermark: int
    last_stable_offset: int
    read_at: float = field(default_factory=time.monotonic)

    @property
    def stale(self) -> bool:
        return time.monotonic() - self.read_at > OFFSETS_MAX_AGE_S


@dataclass(slots=True)
class TierConnectionState:
    topic_ids: dict[str, uuid.UUID] = field(default_factory=dict)
    topic_names: dict[uuid.UUID, str] = field(default_factory=dict)
    # (topic id, partition) -> offsets, present once the broker answered
    # OFFSET_OUT_OF_RANGE for an offset below its local log start on this connection.
    proven: dict[tuple[uuid.UUID, int], PartitionOffsets] = field(default_factory=dict)
    correlation_ids: itertools.count = field(default_factory=lambda: itertools.count(-1, -1))
    #: where the next Fetch starts reading remote partitions, so that each gets its turn
    #: when remote.fetch.max.bytes does not fit them all
    remote_rotation: int = 0
    fetch_session: FetchSessionPositions = field(default_factory=FetchSessionPositions)

    def next_correlation_id(self) -> int:
        correlation_id = next(self.correlation_ids)
        if correlation_id < -(2**31):  # int32 on the wire: start again at -1
            self.correlation_ids = itertools.count(-2, -1)
            return -1
        return correlation_id

    def learn_topic(self, name: str, topic_id: uuid.UUID) -> None:
        self.topic_ids[name] = topic_id
        self.topic_names[topic_id] = name


def connection_state(state: dict) -> TierConnectionState:
    tier_state = state.get("tiered")
    if tier_state is None:
        tier_state = state["tiered"] = TierConnectionState()
    return tier_state


class BrokerQueries:
    def __init__(self, header: RequestHeader, forward: Forward, state: TierConnectionState,
                 metrics: RemoteMetrics | None = None) -> None:
        self._header = header
        self._forward = forward
        self.state = state
        self._metrics = metrics

    async def _ask(self, request):
        started = time.monotonic()
        payload = await self._forward(
            encode_request(request, self.state.next_correlation_id(), self._header.client_id))
        if self._metrics is not None:
            self._metrics.broker_query_seconds.labels(api_name(request.__api_key__)).observe(
                time.monotonic() - started)
        return decode_response(request.__api_key__, request.__version__, payload)

    async def topic_ids(self, names: set[str]) -> dict[str, uuid.UUID]:
        """Current topic ids of `names` (a recreated topic has a new one); unknown or
        unauthorized topics are left out."""
        missing = sorted(n for n in names if n not in self.state.topic_ids)
        if missing:
            response = await self._ask(metadata_request(missing))
            for topic in response.topics:
                if topic.error_code == ErrorCode.none and topic.topic_id is not None:
                    self.state.learn_topic(topic.name, topic.topic_id)
        return {n: self.state.topic_ids[n] for n in names if n in self.state.topic_ids}

    async def list_offsets(
        self, partitions: dict[str, list[int]], spec: int, isolation_level: int = 0
    ) -> dict[tuple[str, int], tuple[ErrorCode, int, int, int]]:
        """(error, offset, timestamp, leader epoch) per (topic, partition)."""
        response = await self._ask(list_offsets_request(partitions, spec, isolation_level))
        return {
            (topic.name, p.partition_index): (ErrorCode(p.error_code), p.offset, p.timestamp, p.leader_epoch)
            for topic in response.topics
            for p in topic.partitions
        }

    async def partition_offsets(self, partitions: dict[str, list[int]], isolation_level: int) -> dict[
        tuple[str, int], PartitionOffsets | ErrorCode
    ]:
        """Local log start, high watermark and last stable offset, or the broker's error."""
        start = await self.list_offsets(partitions, OffsetSpec.EARLIEST)
        end = await self.list_offsets(partitions, OffsetSpec.LATEST)
        stable = await self.list_offsets(partitions, OffsetSpec.LATEST, READ_COMMITTED) if isolation_level else end
        out: dict[tuple[str, int], PartitionOffsets | ErrorCode] = {}
        for key, (error, offset, _, _) in start.items():
            errors = [e for e in (error, end[key][0], stable[key][0]) if e != ErrorCode.none]
            out[key] = errors[0] if errors else PartitionOffsets(offset, end[key][1], stable[key][1])
        return out

    async def aborted_at(self, topic: str, partition: int, offset: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of aborted transactions the broker lists for a
        READ_COMMITTED fetch at `offset` (the local log start): transactions that began
        remotely and whose ABORT marker is local."""
        response = await self._ask(
            fetch_request(topic, partition, offset, 1, isolation_level=READ_COMMITTED, max_wait_ms=0, min_bytes=0)
        )
        (partition_data,) = response.responses[0].partitions
        return [(t.producer_id, t.first_offset) for t in partition_data.aborted_transactions or ()]

