"""What the Fetch and ListOffsets filters keep per client connection, and how they ask
the broker on it.

Their queries (`client.queries`: topic ids, log start, high watermark and last stable
offset, aborted transactions) go on the client's own upstream connection, so the broker
checks them against the client's identity and ACLs; they carry the client's client id
(quotas stay the client's) and correlation ids of the proxy's own (`ConnectionContext.send`).

What they learn is never shared between clients: the broker's OFFSET_OUT_OF_RANGE on
this connection is the proof that lets remote data be served on it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tierproxy.client.queries import ClusterQueries

from ..metrics import api_name
from .context import PerConnection
from .fetch_session import FetchSessionPositions

if TYPE_CHECKING:
    from tierproxy.remote_log.metrics import RemoteMetrics
    from .context import ConnectionContext

__all__ = ("CONNECTION_TOPICS", "OFFSETS_MAX_AGE_S", "ConnectionTopics", "FetchConnectionState", "PartitionOffsets",
           "broker_queries")

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
class ConnectionTopics:
    """The topics' names and ids the broker told on one client connection, shared by the
    filters of the remote tier (Fetch, ListOffsets, read replicas' Produce)."""

    topic_ids: dict[str, uuid.UUID] = field(default_factory=dict)
    topic_names: dict[uuid.UUID, str] = field(default_factory=dict)
    #: when the broker was last asked for the read replica topics' ids (see filters.replica)
    replica_ids_asked_at: float = float("-inf")

    def learn_topic(self, name: str, topic_id: uuid.UUID) -> None:
        self.topic_ids[name] = topic_id
        self.topic_names[topic_id] = name

    async def known_topic_ids(self, queries: ClusterQueries, names: Iterable[str]) -> dict[str, uuid.UUID]:
        """Topic ids of `names`, asked of the broker only for those not learned yet on
        this connection; unknown or unauthorized topics are left out."""
        names = set(names)
        missing = [name for name in names if name not in self.topic_ids]
        if missing:
            for name, topic_id in (await queries.topic_ids(missing)).items():
                self.learn_topic(name, topic_id)
        return {name: self.topic_ids[name] for name in names if name in self.topic_ids}


CONNECTION_TOPICS: PerConnection[ConnectionTopics] = PerConnection(lambda ctx: ConnectionTopics())
"""A connection's `ConnectionTopics`."""


@dataclass(slots=True)
class FetchConnectionState:
    """The Fetch filter's state of one client connection."""

    topics: ConnectionTopics
    #: (topic id, partition) -> offsets, present once the broker answered
    #: OFFSET_OUT_OF_RANGE for an offset below its local log start on this connection.
    proven: dict[tuple[uuid.UUID, int], PartitionOffsets] = field(default_factory=dict)
    #: where the next Fetch starts reading remote partitions, so that each gets its turn
    #: when remote.fetch.max.bytes does not fit them all
    remote_rotation: int = 0
    #: the last Fetch's remote partitions got no bytes because the broker's filled the
    #: response: the next one gives its first remote partition a whole batch all the same
    remote_starved: bool = False
    fetch_session: FetchSessionPositions = field(default_factory=FetchSessionPositions)

    @classmethod
    def of_connection(cls, ctx: ConnectionContext) -> FetchConnectionState:
        return cls(CONNECTION_TOPICS.of(ctx))


def broker_queries(ctx: ConnectionContext, client_id: str | None, metrics: RemoteMetrics) -> ClusterQueries:
    """The cluster queries on the client's connection, each timed by API in `metrics`."""

    async def send(request: Any) -> Any:
        started = time.monotonic()
        response = await ctx.send(request, client_id)
        metrics.broker_query_seconds.labels(api_name(request.__api_key__)).observe(time.monotonic() - started)
        return response

    return ClusterQueries(send)
