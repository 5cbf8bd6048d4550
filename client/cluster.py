"""What the pipeline asks the Kafka cluster: topics and their ids and leaders, offsets,
raw record batches, and DeleteRecords. Each request goes to the partition's leader over
tierproxy's own protocol connection (client.connection), so batches arrive exactly
as the broker stores them. Every connection is secured as the configuration says
(`Cluster.from_config`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tierproxy.config.addresses import parse_host_port
from tierproxy.protocol.apis import ErrorCode, OffsetSpec, error_name
from tierproxy.protocol.requests import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    delete_records_request,
    fetch_request,
    list_offsets_request,
    metadata_request,
)
from .connection import AuthenticationError, KafkaConnection
from .security import PLAINTEXT, Security, security
from tierproxy.config import BOOTSTRAP_SERVERS

__all__ = ["READ_COMMITTED", "READ_UNCOMMITTED", "Cluster", "ClusterError", "check_login", "ListedOffset", "PartitionInfo", "TopicInfo"]


async def check_login(config: Mapping[str, Any], *, client_id: str = "tierproxy") -> None:
    """One Metadata round trip to a bootstrap broker as configured, before a command
    starts its real work: raises AuthenticationError (credentials, certificates) or
    KafkaConnectionError (unreachable), each naming what to fix."""
    async with Cluster.from_config(config, client_id=client_id) as cluster:
        await cluster.topics([])


class ClusterError(RuntimeError):
    """The broker answered with an error for a partition or topic."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    leader: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionInfo]


@dataclass(frozen=True, slots=True)
class ListedOffset:
    offset: int
    timestamp: int
    leader_epoch: int


class Cluster:
    """Connections to the brokers of one cluster, opened lazily, one per node."""

    def __init__(self, bootstrap_servers: Iterable[str], *, security: Security = PLAINTEXT,
                 client_id: str = "tierproxy-pipeline") -> None:
        self._bootstrap = [parse_host_port(server) for server in bootstrap_servers]
        self._security = security
        self._client_id = client_id
        self._brokers: dict[int, tuple[str, int]] = {}
        self._connections: dict[int, KafkaConnection] = {}
        self._bootstrap_connection: KafkaConnection | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, client_id: str = "tierproxy-pipeline") -> Cluster:
        """The configured cluster, with its security (files read and checked now)."""
        return cls(config[BOOTSTRAP_SERVERS], security=security(config), client_id=client_id)

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for connection in [*self._connections.values(), self._bootstrap_connection]:
            if connection is not None:
                await connection.close()
        self._connections.clear()
        self._bootstrap_connection = None

    async def _any(self) -> KafkaConnection:
        if self._bootstrap_connection is None:
            errors = []
            for host, port in self._bootstrap:
                try:
                    self._bootstrap_connection = await KafkaConnection.open(
                        host, port, security=self._security, client_id=self._client_id)
                    break
                except AuthenticationError:
                    raise  # the same credentials fail on every broker
                except ConnectionError as e:
                    errors.append(str(e))
            else:
                raise ConnectionError(f"no bootstrap server reachable: {'; '.join(errors)}")
        return self._bootstrap_connection

    async def _node(self, node_id: int) -> KafkaConnection:
        async with self._lock:
            connection = self._connections.get(node_id)
            if connection is None:
                if node_id not in self._brokers:
                    await self.topics([])
                host, port = self._brokers[node_id]
                connection = await KafkaConnection.open(host, port, security=self._security, client_id=self._client_id)
                self._connections[node_id] = connection
            return connection

    async def topics(self, names: Iterable[str] | None = None) -> dict[str, TopicInfo]:
        """Topics by name (all of them when `names` is None); unknown names are left out."""
        response = await (await self._any()).request(metadata_request(names))
        self._brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
        topics = {}
        for topic in response.topics:
            if topic.error_code == ErrorCode.unknown_topic_or_partition:
                continue
            if topic.error_code != ErrorCode.none:
                raise ClusterError(f"metadata of topic {topic.name}: {error_name(topic.error_code)}", topic.error_code)
            topics[topic.name] = TopicInfo(
                topic.name,
                topic.topic_id,
                {p.partition_index: PartitionInfo(p.partition_index, p.leader_id, p.leader_epoch) for p in topic.partitions},
            )
        return topics

    async def list_offsets(
        self,
        topics: dict[str, TopicInfo],
        partitions: Iterable[tuple[str, int]],
        spec: int,
        *,
        isolation_level: int = READ_UNCOMMITTED,
    ) -> dict[tuple[str, int], ListedOffset]:
        """ListOffsets for each (topic, partition), sent to its leader. With LATEST and
        READ_COMMITTED the answer is the last stable offset."""
        what = f"ListOffsets {OffsetSpec(spec).name if spec < 0 else spec}"
        responses = await self._to_leaders(
            topics, {tp: tp[1] for tp in partitions},
            lambda wanted: list_offsets_request(wanted, spec, isolation_level))
        return {key: ListedOffset(p.offset, p.timestamp, p.leader_epoch)
                for key, p in self._partitions(what, responses)}

    async def fetch_raw(
        self, topics: dict[str, TopicInfo], topic: str, partition: int, offset: int, max_bytes: int, *,
        max_wait_ms: int = 100,
    ):
        """One Fetch (READ_UNCOMMITTED: aborted data and markers included) from the leader;
        the kio partition response, records as the broker sent them."""
        leader = topics[topic].partitions[partition].leader
        response = await (await self._node(leader)).request(
            fetch_request(topic, partition, offset, max_bytes, max_wait_ms=max_wait_ms)
        )
        if response.error_code != ErrorCode.none:
            raise ClusterError(f"Fetch {topic}-{partition}: {error_name(response.error_code)}", response.error_code)
        (partition_response,) = response.responses[0].partitions
        return partition_response

    async def delete_records(
        self, topics: dict[str, TopicInfo], before: dict[tuple[str, int], int], *, timeout_ms: int = 30_000
    ) -> dict[tuple[str, int], int]:
        """DeleteRecords: advance each partition's log start offset to the given offset.
        Returns the new low watermarks."""
        responses = await self._to_leaders(
            topics, {(topic, partition): (partition, offset) for (topic, partition), offset in before.items()},
            lambda wanted: delete_records_request(wanted, timeout_ms), timeout=timeout_ms / 1000 + 10)
        return {key: p.low_watermark for key, p in self._partitions("DeleteRecords", responses)}

    async def _to_leaders(self, topics: dict[str, TopicInfo], items: Mapping[tuple[str, int], Any],
                          build: Any, *, timeout: float = 30.0) -> list[Any]:
        """One request per leader, built from {topic: [item, ...]} of the partitions it leads."""
        by_leader: dict[int, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
        for (topic, partition), item in items.items():
            by_leader[topics[topic].partitions[partition].leader][topic].append(item)

        async def ask(leader: int, wanted: dict[str, list[Any]]) -> Any:
            return await (await self._node(leader)).request(build(wanted), timeout=timeout)

        return await asyncio.gather(*(ask(leader, wanted) for leader, wanted in by_leader.items()))

    @staticmethod
    def _partitions(what: str, responses: list[Any]) -> Iterable[tuple[tuple[str, int], Any]]:
        """((topic, partition), partition response) of every answer; ClusterError on any error."""
        for response in responses:
            for topic in response.topics:
                for p in topic.partitions:
                    if p.error_code != ErrorCode.none:
                        raise ClusterError(f"{what} of {topic.name}-{p.partition_index}: {error_name(p.error_code)}",
                                           p.error_code)
                    yield (topic.name, p.partition_index), p
