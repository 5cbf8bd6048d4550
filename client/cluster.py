"""What the pipeline asks the Kafka cluster: topics and their ids and leaders, offsets,
raw record batches, and DeleteRecords. The questions themselves are `client.queries`;
here each goes to the partition's leader over tierproxy's own protocol connection
(client.connection), so batches arrive exactly as the broker stores them, and the
requests for different leaders run concurrently. Every connection is secured as the
configuration says (`Cluster.from_config`).
"""

from __future__ import annotations

import asyncio
import functools
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from tierproxy.config.addresses import parse_host_port
from tierproxy.protocol.apis import ErrorCode, OffsetSpec, error_name
from tierproxy.protocol.requests import READ_COMMITTED, READ_UNCOMMITTED
from .connection import AuthenticationError, KafkaConnection
from .queries import ClusterError, ClusterQueries, ListedOffset, PartitionInfo, TopicInfo
from .security import PLAINTEXT, Security, security
from tierproxy.config import BOOTSTRAP_SERVERS, Settings

__all__ = ["READ_COMMITTED", "READ_UNCOMMITTED", "Cluster", "ClusterError", "LeaderUnavailable", "check_login",
           "ListedOffset", "PartitionInfo", "TopicInfo"]

T = TypeVar("T")


class LeaderUnavailable(ConnectionError):
    """A partition's leader did not answer (unreachable, its connection broke or timed
    out), or the partition has no leader: only the partitions it leads are affected."""


async def check_login(config: Settings, *, client_id: str = "tierproxy") -> None:
    """One Metadata round trip to a bootstrap broker as configured, before a command
    starts its real work: raises AuthenticationError (credentials, certificates) or
    KafkaConnectionError (unreachable), each naming what to fix."""
    async with Cluster.from_config(config, client_id=client_id) as cluster:
        await cluster.topics([])


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
    def from_config(cls, config: Settings, *, client_id: str = "tierproxy-pipeline") -> Cluster:
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
                except TimeoutError:  # took the connection, did not answer ApiVersions
                    errors.append(f"broker {host}:{port} did not answer ApiVersions in time")
            else:
                raise ConnectionError(f"no bootstrap server reachable: {'; '.join(errors)}")
        return self._bootstrap_connection

    async def _forget(self, node_id: int) -> None:
        """Drop a node's connection after it failed: the next request opens a new one."""
        async with self._lock:
            connection = self._connections.pop(node_id, None)
        if connection is not None:
            await connection.close()

    async def _node(self, node_id: int) -> KafkaConnection:
        async with self._lock:
            connection = self._connections.get(node_id)
            if connection is None:
                if node_id not in self._brokers:
                    await self.topics([])
                if node_id not in self._brokers:
                    raise LeaderUnavailable(f"broker {node_id} is not in the cluster's metadata")
                host, port = self._brokers[node_id]
                connection = await KafkaConnection.open(host, port, security=self._security, client_id=self._client_id)
                self._connections[node_id] = connection
            return connection

    async def topics(self, names: Iterable[str] | None = None) -> dict[str, TopicInfo]:
        """Topics by name (all of them when `names` is None); unknown names are left out."""
        metadata = await ClusterQueries((await self._any()).request).metadata(names)
        self._brokers = metadata.brokers
        for name, code in metadata.errors.items():
            if code != ErrorCode.unknown_topic_or_partition:
                raise ClusterError(f"metadata of topic {name}: {error_name(code)}", code)
        return metadata.topics

    async def list_offsets(
        self,
        topics: dict[str, TopicInfo],
        partitions: Iterable[tuple[str, int]],
        spec: int,
        *,
        isolation_level: int = READ_UNCOMMITTED,
        failures: dict[tuple[str, int], Exception] | None = None,
    ) -> dict[tuple[str, int], ListedOffset]:
        """ListOffsets for each (topic, partition), sent to its leader. With LATEST and
        READ_COMMITTED the answer is the last stable offset. A partition the broker refuses,
        or whose leader is unavailable, raises; with `failures` it is left out and its
        error put there instead, so that one broker down fails only its partitions."""
        what = f"ListOffsets {OffsetSpec(spec).name if spec < 0 else spec}"
        answers = await self._to_leaders(
            topics, {tp: tp[1] for tp in partitions},
            lambda queries, wanted: queries.list_offsets(wanted, spec, isolation_level))
        return _without_errors(what, answers, failures)

    async def fetch_raw(
        self, topics: dict[str, TopicInfo], topic: str, partition: int, offset: int, max_bytes: int, *,
        max_wait_ms: int = 100,
    ):
        """One Fetch (READ_UNCOMMITTED: aborted data and markers included) from the leader;
        the kio partition response, records as the broker sent them."""
        leader = topics[topic].partitions[partition].leader
        queries = ClusterQueries((await self._node(leader)).request)
        return await queries.fetch(topic, partition, offset, max_bytes, max_wait_ms=max_wait_ms)

    async def delete_records(
        self, topics: dict[str, TopicInfo], before: dict[tuple[str, int], int], *, timeout_ms: int = 30_000
    ) -> dict[tuple[str, int], int]:
        """DeleteRecords: advance each partition's log start offset to the given offset.
        Returns the new low watermarks."""
        answers = await self._to_leaders(
            topics, {(topic, partition): (partition, offset) for (topic, partition), offset in before.items()},
            lambda queries, wanted: queries.delete_records(wanted, timeout_ms), timeout=timeout_ms / 1000 + 10)
        return _without_errors("DeleteRecords", answers)

    async def _to_leaders(
        self, topics: dict[str, TopicInfo], items: Mapping[tuple[str, int], Any],
        ask: Callable[[ClusterQueries, dict[str, list[Any]]], Awaitable[dict[tuple[str, int], T]]], *,
        timeout: float = 30.0,
    ) -> dict[tuple[str, int], T | LeaderUnavailable]:
        """`ask` each leader, concurrently, about {topic: [item, ...]} of the partitions it
        leads. The partitions of a leader that does not answer get LeaderUnavailable."""
        by_leader: dict[int, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
        for (topic, partition), item in items.items():
            by_leader[topics[topic].partitions[partition].leader][topic].append(item)

        async def ask_leader(leader: int, wanted: dict[str, list[Any]]) -> dict[tuple[str, int], Any]:
            try:
                if leader < 0:
                    raise LeaderUnavailable("no leader")
                connection = await self._node(leader)
                return await ask(ClusterQueries(functools.partial(connection.request, timeout=timeout)), wanted)
            except (ConnectionError, TimeoutError) as e:
                if isinstance(e, AuthenticationError):
                    raise  # the same credentials fail on every broker
                await self._forget(leader)
                error = e if isinstance(e, LeaderUnavailable) else LeaderUnavailable(f"leader {leader}: {e}")
                return {(topic, partition): error for (topic, partition) in items
                        if topics[topic].partitions[partition].leader == leader}

        answers: dict[tuple[str, int], Any] = {}
        for answer in await asyncio.gather(*(ask_leader(leader, wanted) for leader, wanted in by_leader.items())):
            answers.update(answer)
        return answers


def _without_errors(
    what: str, answers: Mapping[tuple[str, int], T | ErrorCode | Exception],
    failures: dict[tuple[str, int], Exception] | None = None,
) -> dict[tuple[str, int], T]:
    """The answers, or ClusterError naming the first partition the broker refused (the
    first LeaderUnavailable likewise); with `failures`, those partitions go there instead."""
    out: dict[tuple[str, int], T] = {}
    for (topic, partition), answer in answers.items():
        if isinstance(answer, ErrorCode):
            error: Exception = ClusterError(f"{what} of {topic}-{partition}: {error_name(answer)}", answer)
        elif isinstance(answer, Exception):
            error = LeaderUnavailable(f"{what} of {topic}-{partition}: {answer}")
        else:
            out[(topic, partition)] = answer
            continue
        if failures is None:
            raise error
        failures[(topic, partition)] = error
    return out
