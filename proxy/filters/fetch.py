"""Fetch: the tail from the broker, offsets it no longer keeps from the remote tier.

Kafka's rule (ReplicaManager): a partition is read remotely only when
`remote log start <= fetch offset < local log start`. The request goes to the broker
on the client's own connection; for each partition it answers OFFSET_OUT_OF_RANGE,
the handler asks the broker (same connection) for the local log start, and serves the
partition from the remote tier when the rule holds. Anything else the broker says,
authorization errors included, goes back unchanged.

That OFFSET_OUT_OF_RANGE is the proof that the client may read the partition. For a
second it lets later sessionless fetches of remote offsets on the connection skip the
broker; then the partition goes to the broker again, whose answer renews the proof (and
the high watermark). Kafka checks READ on every Fetch: renewing the proof with a Fetch, not with
ListOffsets (which needs only DESCRIBE), makes a READ permission taken away apply to
remote offsets within that second too.

Fetch sessions (KIP-227) pass through to the broker, which keeps them: a request with a
session is forwarded as the client sent it, never decoded unless the broker answers a
partition OFFSET_OUT_OF_RANGE, and only those partitions are replaced in the response.
The broker answers such a partition at once in every response of the session (errors
always go back) until the client's position reaches its local log; a partition the
client omits because its position did not move is served from the position the proxy
kept (`fetch_session`). The proxy's own queries to the broker are sessionless.

Remote partitions are read concurrently on the reader pool, each within its
partition_max_bytes, all of them within what is left of the response's max_bytes and
at most `remote.fetch.max.bytes`; the first of them, in reading order, that has
records gets at least one whole batch (KIP-74). When that bound does not fit them all, the next Fetch on the
connection starts with the partitions left out, so each gets its turn; when the broker's
records left no room for any remote bytes, the next Fetch gives the first remote partition
one whole batch all the same, so that a busy local tail cannot starve the remote ones.

Kafka answers a Fetch as soon as `min_bytes` are available. When partitions are read
remotely without asking the broker, the broker is asked for the rest without waiting;
only if remote and local bytes together stay under `min_bytes` is it asked again,
for what is left of `max_wait_ms`.

The broker's response is never decoded by kio: a scan of its partitions' error codes
tells whether any is OFFSET_OUT_OF_RANGE, and if none is, it goes back as it came. A
merged response is written as buffers: the broker's partitions as slices of its payload,
remote records as the reader's slices (`protocol.fetch_wire`). Either way the response carries
what the scan found of its top-level tagged fields, where node endpoints (v16+) would
be, for the address filter that sees it next.

The client's request is parsed once: `request_session` walks it, bounding every
length, before anything else; kio decodes it only when the filter needs its partitions,
without walking it again.

What needs no I/O (byte budgets, the remote partitions' turns, the second broker
request, the merged response's order) is decided in `fetch_plan`; this filter asks the
broker and the remote tier and applies it.

Read replica topics (`replica`) are remote only: their partitions reach the broker at an
offset beyond any log, so that it answers at once, OFFSET_OUT_OF_RANGE or an
authorization error, and the remote tier serves them whatever the broker's offsets say;
one the remote log metadata does not name is REPLICA_NOT_AVAILABLE, never an empty log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from kio.static.primitive import i32, i32Timedelta

from tierproxy.client.queries import ClusterQueries, LogOffsets
from tierproxy.protocol.apis import ApiKey, ErrorCode
from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.codecs import INTERCEPTED
from tierproxy.storage.errors import MetadataNotReady
from tierproxy.storage.model import TopicIdPartition

from tierproxy.remote_log.reader import RemoteReadResult
from tierproxy.remote_log.reader_pool import ReadOutcome
from ..tiered import RemoteTier
from .chain import AnswerCheck, CallNext, Filter
from .context import ConnectionContext
from .fetch_plan import (
    assemble,
    broker_part,
    first_gets_whole_batch,
    proven_below,
    remote_budget,
    remote_turn,
    response_order,
    second_request,
    takes,
)
from tierproxy.protocol.fetch_wire import (
    FLEXIBLE_VERSION,
    SESSIONLESS,
    TOPIC_ID_VERSION,
    RemotePartition,
    ScannedResponse,
    encode_fetch_response,
    request_session,
    scan_fetch_response,
)
from .messages import ClientRequest, InvalidRequest, Response
from .replica import ReadReplicas
from .context import PerConnection
from .tiered_state import FetchConnectionState, PartitionOffsets, broker_queries
from tierproxy.config import REMOTE_FETCH_MAX_BYTES

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = logging.getLogger("tierproxy.fetch")

READ_COMMITTED = 1
_NO_WAIT = i32Timedelta.parse(datetime.timedelta(0))
_NO_TAGGED_FIELDS = b"\x00"


class _Remote:
    """One partition the remote tier answers in this request."""

    __slots__ = ("topic_key", "request", "tp", "offsets", "remote_log_start", "outcome", "error", "min_one_batch",
                 "turn", "answer", "replica")

    def __init__(self, topic_key: Any, request: Any, tp: TopicIdPartition, offsets: PartitionOffsets,
                 remote_log_start: int | None = None, replica: bool = False) -> None:
        self.topic_key = topic_key
        self.request = request
        self.tp = tp
        self.offsets = offsets
        #: The remote log start offset when this request read it already (None: not yet).
        self.remote_log_start = remote_log_start
        self.outcome: ReadOutcome[RemoteReadResult] | None = None  # None: not read this time
        self.error: ErrorCode | None = None
        self.min_one_batch = False
        self.turn = 0  # its place in this request's reading order
        self.answer: RemotePartition | None = None
        #: A read replica partition: its leader epochs and log end are the origin's.
        self.replica = replica


def _answers_error(remote: list[_Remote]) -> bool:
    """Whether a remote partition answers an error: Kafka answers a Fetch at once then,
    whatever min_bytes and max_wait_ms ask (an expired read is empty, not an error)."""
    for entry in remote:
        outcome = entry.outcome
        if entry.error is not None or (outcome is not None and (
                outcome.error is not None or (outcome.value is not None and outcome.value.offset_out_of_range))):
            return True
    return False


class FetchFilter(Filter):
    apis = MappingProxyType({ApiKey.FETCH: INTERCEPTED[ApiKey.FETCH]})

    def __init__(self, tier: RemoteTier) -> None:
        self.tier = tier
        self.remote_max_bytes: int = tier.config[REMOTE_FETCH_MAX_BYTES]
        self.replicas = ReadReplicas.of(tier)
        self._states = PerConnection(FetchConnectionState.of_connection)

    async def start(self) -> None:
        await self.tier.start()

    async def close(self) -> None:
        await self.tier.close()

    def pass_through(self, ctx: ConnectionContext, client_request: ClientRequest) -> AnswerCheck | None:
        """A Fetch that goes to the broker as the client sent it (a session's, or one without
        a session on a connection with nothing proven remote) needs no task: the broker's
        answer is scanned once and goes back as it came, unless a partition is
        OFFSET_OUT_OF_RANGE (then `handle` takes the answer from there)."""
        if self.replicas:  # their partitions go to the broker beyond any log: the request is changed
            return None
        state = self._states.of(ctx)
        session = _session(client_request)
        if session == SESSIONLESS and state.proven:
            return None
        positions = state.fetch_session
        positions.request(*session)
        version = client_request.api_version

        def as_answered(response: Response) -> bool:
            scan = scan_fetch_response(response.payload, version)
            if scan.any_out_of_range:
                return False
            positions.response(scan)
            response.tagged_fields = scan.tagged_fields  # for the address filter's check
            return True

        return as_answered

    async def handle(self, ctx: ConnectionContext, client_request: ClientRequest, call_next: CallNext) -> Response:
        state = self._states.of(ctx)
        session = _session(client_request)
        if self.replicas and client_request.api_version >= TOPIC_ID_VERSION:
            await self.replicas.learn_topic_ids(state.topics, self._queries(ctx, client_request),
                                                [t.topic_id for t in client_request.body.topics])
        if session == SESSIONLESS and state.proven:
            return await self._sessionless(ctx, client_request, call_next, state)
        return await self._as_sent(ctx, client_request, call_next, state, session)

    async def _as_sent(
        self, ctx: ConnectionContext, client_request: ClientRequest, call_next: CallNext,
        state: FetchConnectionState, session: tuple[int, int],
    ) -> Response:
        """The client's request forwarded unchanged; decoded (unless it already is) only
        if the broker answers a partition out of range."""
        version = client_request.api_version
        positions = state.fetch_session
        if client_request.answer is None:  # else pass_through counted the request
            positions.request(*session)
        payload = (await call_next(self._replicas_hidden(client_request, state))).payload
        scan = scan_fetch_response(payload, version)
        positions.response(scan)
        if not scan.any_out_of_range:
            return _as_answered(payload, scan, version)
        request = client_request.body
        queries = self._queries(ctx, client_request)
        remote = await self._out_of_range(request, scan, version >= TOPIC_ID_VERSION, state, queries)
        if remote is None:
            log.info("%s: a partition the fetch session omitted is out of range on the broker at a position "
                     "the proxy does not know; the client starts a new session", ctx.peer)
            return _fetch_response(version, encode_fetch_response(
                version, [], throttle_time_ms=scan.throttle_time_ms,
                error_code=int(ErrorCode.fetch_session_id_not_found)))
        if not remote:
            return _as_answered(payload, scan, version)
        started = time.monotonic()
        # With nothing from the broker, the Fetch may wait its max_wait_ms for its turn at
        # the fetch quota (see _sessionless).
        turn_wait = 0.0 if scan.records_size else request.max_wait.total_seconds()
        remote_bytes = await self._read(remote, request, scan.records_size, state, turn_wait)
        await self._hold_at_replica_end(request, started, remote, scan.records_size + remote_bytes)
        response = await self._merge(request, payload, scan, remote, queries, scan.records_size)
        for entry in remote:
            assert entry.answer is not None  # _merge answers every remote partition
            positions.served((entry.topic_key, entry.request.partition), entry.request, entry.answer.records_size > 0)
        return response

    def _replicas_hidden(self, client_request: ClientRequest, state: FetchConnectionState) -> ClientRequest:
        """The request for the broker: replica partitions beyond any log (see replica)."""
        if not self.replicas:
            return client_request
        request = client_request.body
        hidden = self.replicas.hide_from_broker(request, client_request.api_version >= TOPIC_ID_VERSION, state.topics)
        return client_request if hidden is request else client_request.replaced(hidden)

    def _queries(self, ctx: ConnectionContext, client_request: ClientRequest) -> ClusterQueries:
        return broker_queries(ctx, client_request.header.client_id, self.tier.metrics)

    async def _sessionless(
        self, ctx: ConnectionContext, client_request: ClientRequest, call_next: CallNext,
        state: FetchConnectionState,
    ) -> Response:
        """A request without a session on a connection with partitions proven remote:
        those skip the broker."""
        version = client_request.api_version
        request = client_request.body
        queries = self._queries(ctx, client_request)
        by_id = version >= TOPIC_ID_VERSION

        started = time.monotonic()
        direct = self._direct_partitions(request, by_id, state)
        if not direct:
            return await self._as_sent(ctx, client_request, call_next, state, SESSIONLESS)
        broker_request = broker_part(request, direct, by_id)
        if broker_request is not None and broker_request.max_wait:
            # Kafka answers once min_bytes are there: the remote part may already be
            # enough, so the broker is asked not to wait (see _await_min_bytes).
            broker_request = dataclasses.replace(broker_request, max_wait=_NO_WAIT)
        if broker_request is not None and self.replicas:
            broker_request = self.replicas.hide_from_broker(broker_request, by_id, state.topics)

        scan = None
        payload = None
        if broker_request is not None:
            payload = (await call_next(client_request.replaced(broker_request))).payload
            scan = scan_fetch_response(payload, version)

        remote = list(direct.values())
        if scan is not None and scan.any_out_of_range:
            remote += await self._out_of_range(request, scan, by_id, state, queries) or []
        used = scan.records_size if scan is not None else 0
        # A Fetch the broker has no part in may wait its max_wait_ms for its turn at the
        # fetch quota, as a broker parks a fetch without data: the client does not spin.
        turn_wait = 0.0 if broker_request is not None else \
            request.max_wait.total_seconds() - (time.monotonic() - started)
        remote_bytes = await self._read(remote, request, used, state, turn_wait)
        if broker_request is not None and used + remote_bytes < request.min_bytes and not _answers_error(remote):
            waited = await self._await_min_bytes(request, broker_request, client_request, call_next, started,
                                                 remote_bytes)
            if waited is not None:
                payload, scan = waited
                used = scan.records_size
        await self._hold_at_replica_end(request, started, remote, used + remote_bytes)
        return await self._merge(request, payload, scan, remote, queries, used, in_request_order=True)

    @staticmethod
    async def _hold_at_replica_end(request: Any, started: float, remote: list[_Remote], available: int) -> None:
        """The broker answers a replica partition at once, so with nothing to answer the
        Fetch waits what is left of its max_wait_ms here, as a broker parks a fetch at the
        log end: a consumer at the end of a replica does not spin. Not after a remote read
        that ran out of remote.fetch.max.wait.ms: its partition is not at its end, and Kafka's
        DelayedRemoteFetch answers such a read empty at once."""
        if available or not any(entry.replica for entry in remote) or _answers_error(remote) or any(
                entry.outcome is not None and entry.outcome.expired for entry in remote):
            return
        left = request.max_wait.total_seconds() - (time.monotonic() - started)
        if left > 0:
            await asyncio.sleep(left)

    async def _await_min_bytes(
        self, request: Any, broker_request: Any, client_request: ClientRequest, call_next: CallNext, started: float,
        remote_bytes: int,
    ) -> tuple[Buffer, ScannedResponse] | None:
        """Ask the broker again, waiting what is left of max_wait_ms for the bytes still
        missing; None when no time is left or its answer needs the remote tier after all
        (the first answer then stands: the client simply fetches again)."""
        second = second_request(request.max_wait, datetime.timedelta(seconds=time.monotonic() - started),
                                request.min_bytes, remote_bytes)
        if second is None:
            return None
        max_wait, min_bytes = second
        waiting = dataclasses.replace(broker_request, max_wait=i32Timedelta.parse(max_wait), min_bytes=i32(min_bytes))
        payload = (await call_next(client_request.replaced(waiting))).payload
        scan = scan_fetch_response(payload, request.__version__)
        return None if scan.any_out_of_range else (payload, scan)

    # ------------------------------------------------------------------ splitting

    def _direct_partitions(
        self, request: Any, by_id: bool, state: FetchConnectionState
    ) -> dict[tuple[Any, int], _Remote]:
        """Partitions proven remote on this connection less than a second ago; a stale
        proof is renewed by the broker's answer to the Fetch itself (see above)."""
        direct = {}
        for topic in request.topics if state.proven else ():
            topic_id = topic.topic_id if by_id else state.topics.topic_ids.get(topic.topic)
            name = self._name(topic, by_id, state)
            if topic_id is None or name is None:
                continue
            for partition in topic.partitions:
                offsets = state.proven.get((topic_id, partition.partition))
                if not proven_below(offsets, partition.fetch_offset):
                    continue
                try:
                    tp = self._tier_partition(topic_id, name, partition.partition)
                except MetadataNotReady:
                    continue  # the broker's OFFSET_OUT_OF_RANGE brings it to _replica_partition, which answers it
                key = (topic.topic_id if by_id else topic.topic, partition.partition)
                direct[key] = _Remote(key[0], partition, tp, offsets, replica=name in self.replicas)
        return direct

    def _tier_partition(self, topic_id: Any, name: str, partition: int) -> TopicIdPartition:
        """The partition in the remote log metadata: a read replica's is the origin's.
        Raises MetadataNotReady (see ReadReplicas.origin_partition)."""
        if name in self.replicas:
            return self.replicas.origin_partition(name, partition)
        return TopicIdPartition(topic_id, name, partition)

    @staticmethod
    def _name(topic: Any, by_id: bool, state: FetchConnectionState) -> str | None:
        return state.topics.topic_names.get(topic.topic_id) if by_id else topic.topic

    async def _refresh(
        self, partitions: Iterable[tuple[str, int]], isolation_level: int, state: FetchConnectionState,
        queries: ClusterQueries,
    ) -> None:
        wanted: dict[str, list[int]] = {}
        for name, partition in partitions:
            wanted.setdefault(name, []).append(partition)
        answers = await queries.log_offsets(wanted, isolation_level)
        for (name, partition), answer in answers.items():
            topic_id = state.topics.topic_ids.get(name)
            if topic_id is None:
                continue
            if isinstance(answer, LogOffsets):
                state.proven[(topic_id, partition)] = PartitionOffsets(
                    answer.log_start_offset, answer.high_watermark, answer.last_stable_offset)
            else:  # the broker refuses now (ACLs changed, topic gone): prove again
                state.proven.pop((topic_id, partition), None)

    async def _out_of_range(
        self, request: Any, scan: ScannedResponse, by_id: bool, state: FetchConnectionState, queries: ClusterQueries
    ) -> list[_Remote] | None:
        """Partitions the broker refused with OFFSET_OUT_OF_RANGE below its local log start;
        None when one of them is at a position neither the request nor the fetch session
        gives."""
        out_of_range = []
        requested = {
            (t.topic_id if by_id else t.topic, p.partition): p for t in request.topics for p in t.partitions
        }
        for key, partitions in scan.topics:
            for partition in partitions:
                if partition.error_code == ErrorCode.offset_out_of_range:
                    tp_key = (key, partition.partition_index)
                    fetch_partition = requested.get(tp_key)
                    if fetch_partition is None:
                        fetch_partition = state.fetch_session.position(tp_key)
                    if fetch_partition is None:
                        return None
                    out_of_range.append((key, fetch_partition))
        if by_id:
            names = {tp.topic_id: tp.topic for tp in self.tier.rlmm.partitions()}
            for known_id, known_name in names.items():
                if known_id not in state.topics.topic_names:
                    state.topics.learn_topic(known_name, known_id)
        else:
            await state.topics.known_topic_ids(queries, {key for key, _ in out_of_range if isinstance(key, str)})
        candidates = []
        replicas: list[_Remote] = []
        topic_id: uuid.UUID | None
        name: str | None
        for key, fetch_partition in out_of_range:
            if isinstance(key, uuid.UUID):  # by_id
                topic_id, name = key, state.topics.topic_names.get(key)
            else:
                topic_id, name = state.topics.topic_ids.get(key), key
            if topic_id is None or name is None:
                continue  # nothing remote for a topic the metadata does not know
            if name in self.replicas:
                replica = self._replica_partition(key, fetch_partition, topic_id, name, state)
                if replica is not None:
                    replicas.append(replica)
                continue
            tp = TopicIdPartition(topic_id, name, fetch_partition.partition)
            try:
                remote_start = self.tier.remote_log_start(tp)
            except MetadataNotReady:
                remote_start = -1  # decided below, once the broker's offsets are known
            if remote_start is None or fetch_partition.fetch_offset < max(remote_start, 0):
                continue  # below the remote log start: the client's reset policy applies
            candidates.append((key, fetch_partition, tp, remote_start if remote_start >= 0 else None))
        # A fresh proof below whose local log start the position lies stands (a fetch
        # session meets this on every request); otherwise the broker is asked.
        unproven = {(tp.topic, tp.partition) for _, fetch_partition, tp, _ in candidates
                    if not proven_below(state.proven.get((tp.topic_id, tp.partition)), fetch_partition.fetch_offset)}
        if unproven:
            await self._refresh(unproven, request.isolation_level, state, queries)
        remote = []
        for key, fetch_partition, tp, remote_start in candidates:
            offsets = state.proven.get((tp.topic_id, tp.partition))
            if offsets is None or fetch_partition.fetch_offset >= offsets.local_log_start:
                state.proven.pop((tp.topic_id, tp.partition), None)
                continue  # above the log end, or the broker refuses: its answer stands
            remote.append(_Remote(key, fetch_partition, tp, offsets, remote_start))
        return remote + replicas

    def _replica_partition(
        self, key: Any, fetch_partition: Any, topic_id: Any, name: str, state: FetchConnectionState
    ) -> _Remote | None:
        """A read replica partition the broker answered OFFSET_OUT_OF_RANGE (the proof): the
        remote tier answers it whatever the broker's offsets say; None when the offset is
        outside the remote log too (the broker's OFFSET_OUT_OF_RANGE stands)."""
        tp = TopicIdPartition(topic_id, name, fetch_partition.partition)  # the error's, if the origin's is not known
        try:
            tp = self._tier_partition(topic_id, name, fetch_partition.partition)
            offsets = self.replicas.offsets(tp)
            log_start = self.replicas.log_start(tp)
        except MetadataNotReady as e:
            entry = _Remote(key, fetch_partition, tp, PartitionOffsets(-1, -1, -1), replica=True)
            entry.error = self.tier.error_code_for(tp, e, "FETCH")
            return entry
        if not log_start <= fetch_partition.fetch_offset <= offsets.high_watermark:
            state.proven.pop((topic_id, fetch_partition.partition), None)
            return None
        state.proven[(topic_id, fetch_partition.partition)] = offsets
        return _Remote(key, fetch_partition, tp, offsets, log_start, replica=True)

    # ------------------------------------------------------------------ reading

    async def _read(self, remote: list[_Remote], request: Any, used: int, state: FetchConnectionState,
                    turn_wait: float) -> int:
        """Read the remote partitions that fit remote.fetch.max.bytes, starting where the
        connection's last Fetch stopped, once the fetch quota gives this connection its turn
        (waiting up to `turn_wait` seconds for it); return the bytes read."""
        budget = remote_budget(request.max_bytes, used, self.remote_max_bytes)
        indexes, state.remote_rotation = remote_turn([e.request.partition_max_bytes for e in remote],
                                                     state.remote_rotation, budget)
        chosen = [remote[i] for i in indexes]
        # Read concurrently, any of them may be the first with records: each may read its
        # one whole batch, and the merge grants it to the first in reading order that has one.
        whole_batch = first_gets_whole_batch(used, state.remote_starved)
        for turn, entry in enumerate(chosen, 1):
            entry.min_one_batch, entry.turn = whole_batch, turn
        turns = self.tier.fetch_turns
        nbytes = turns.turn_bytes([e.request.partition_max_bytes for e in chosen], budget,
                                  self.tier.engine.chunk_cache.chunk_size)
        if chosen and not turns.try_turn(id(state), nbytes):
            held_since = time.monotonic()
            if not await turns.turn(id(state), nbytes, turn_wait):  # KIP-956: empty records, no error
                self.tier.metrics.fetch_throttle_seconds.observe(
                    max(time.monotonic() - held_since, self.tier.fetch_quota.throttle_time()))
                return 0
            self.tier.metrics.fetch_throttle_seconds.observe(time.monotonic() - held_since)

        async def read(entry: _Remote) -> None:
            if entry.replica and entry.request.fetch_offset >= entry.offsets.high_watermark:
                return  # at the log end: nothing yet, and no error
            remote_start = entry.remote_log_start
            if remote_start is None:
                try:
                    remote_start = self.tier.remote_log_start(entry.tp)
                except MetadataNotReady as e:
                    entry.error = self.tier.error_code_for(entry.tp, e, "FETCH")
                    return
                if remote_start is None:
                    entry.error = ErrorCode.offset_out_of_range
                    return
            entry.outcome = await self.tier.engine.read(
                entry.tp,
                entry.request.fetch_offset,
                min(entry.request.partition_max_bytes, budget),
                min_one_batch=entry.min_one_batch,
                # This cluster's leader epochs say nothing of the origin's remote log.
                leader_epoch=-1 if entry.replica else getattr(entry.request, "current_leader_epoch", -1),
                isolation_level=request.isolation_level,
                log_start_offset=remote_start,
            )

        # The quota records bytes as the store reads them (the chunk cache tells it); until
        # then what this turn may read is set aside, so that turns after it do not all pass
        # the same check.
        with turns.reading(nbytes):
            if len(chosen) == 1:
                await read(chosen[0])
            else:
                await asyncio.gather(*(read(entry) for entry in chosen))
        served = sum(e.outcome.value.records_size for e in chosen
                     if e.outcome is not None and e.outcome.value is not None)
        state.remote_starved = served == 0 and used > 0
        return served

    # ------------------------------------------------------------------ the response

    async def _merge(
        self, request: Any, payload: Buffer | None, scan: ScannedResponse | None,
        remote: list[_Remote], queries: ClusterQueries, used: int, in_request_order: bool = False,
    ) -> Response:
        """The response in the broker's order (an incremental one names partitions the
        request omitted), or in request order when some partitions skipped the broker:
        broker partitions as slices of its payload, remote ones encoded here."""
        broker = {}
        if scan is not None:
            assert payload is not None  # the broker's answer comes with its scan
            view = memoryview(payload)
            for key, scanned in scan.topics:
                for partition in scanned:
                    broker[(key, partition.partition_index)] = view[partition.start:partition.end]
        # The remote partitions in reading order (those not read last): the first with
        # records keeps its one whole batch, the others what fits.
        budget = remote_budget(request.max_bytes, used, self.remote_max_bytes)
        whole_batch = any(e.min_one_batch for e in remote)
        for entry in sorted(remote, key=lambda e: e.turn or len(remote) + 1):
            entry.answer = await self._remote_partition(entry, request, queries, budget, whole_batch)
            budget -= entry.answer.records_size
            whole_batch = whole_batch and not entry.answer.records_size
        order = response_order(request, None if in_request_order or scan is None else scan.topics)
        topics = assemble(order, {(e.topic_key, e.request.partition): e.answer for e in remote if e.answer is not None},
                          broker)
        version = request.__version__
        if scan is None:
            return _fetch_response(version, encode_fetch_response(version, topics))
        # The broker's tagged fields go back as they came; node endpoints among them are
        # the address filter's, which sees this response next.
        return _fetch_response(version, encode_fetch_response(
            version, topics, throttle_time_ms=scan.throttle_time_ms, error_code=scan.error_code,
            session_id=scan.session_id, tagged_fields=scan.tagged_fields if scan.tagged_fields is not None else b""),
            scan.tagged_fields)

    async def _remote_partition(
        self, entry: _Remote, request: Any, queries: ClusterQueries, budget: int, whole_batch: bool
    ) -> RemotePartition:
        offsets = entry.offsets
        error = entry.error
        records: list[memoryview] = []
        size = 0
        log_start = -1
        aborted: Sequence[tuple[int, int]] | None = None
        outcome = entry.outcome
        if error is None and outcome is not None:
            if outcome.error is not None:
                error = self.tier.error_code_for(entry.tp, outcome.error, "FETCH")
            elif outcome.value is not None:
                result = outcome.value
                log_start = result.log_start_offset
                if result.offset_out_of_range:
                    error = ErrorCode.offset_out_of_range
                # Whole batches that fit the partition's and the response's bounds, or KIP-74's one.
                elif takes(result.records_size, min(entry.request.partition_max_bytes, budget), whole_batch):
                    records, size = result.records, result.records_size
                    self.tier.metrics.remote_partitions_served.labels(entry.tp.topic).inc()
                    if request.isolation_level == READ_COMMITTED:
                        aborted = await self._aborted(entry, result, queries)
        if aborted is None and request.isolation_level == READ_COMMITTED and error is None:
            aborted = ()
        return RemotePartition(
            partition_index=entry.request.partition,
            error_code=int(error) if error is not None else 0,
            high_watermark=offsets.high_watermark,
            last_stable_offset=offsets.last_stable_offset,
            log_start_offset=log_start,
            aborted_transactions=aborted,
            records=records,
            records_size=size,
        )

    async def _aborted(
        self, entry: _Remote, result: RemoteReadResult, queries: ClusterQueries
    ) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions in what is served."""
        found = {(t.producer_id, t.first_offset) for t in result.aborted_transactions or ()}
        if not result.aborted_transactions_complete and not entry.replica:  # a replica has no local log
            # An ABORT marker of a transaction served here may be in the local log.
            last_served = result.next_fetch_offset - 1
            local = await queries.aborted_transactions(entry.tp.topic, entry.tp.partition,
                                                       entry.offsets.local_log_start)
            found |= {(pid, first) for pid, first in local if first <= last_served}
        return sorted(found, key=lambda t: t[1])


def _session(client_request: ClientRequest) -> tuple[int, int]:
    """The request's fetch session (id, epoch), once its structure is checked."""
    try:
        session = request_session(client_request.payload, client_request.api_version)
    except DecodeError as e:
        raise InvalidRequest(str(e)) from None
    client_request.structure_checked()  # every length bounded: kio need not walk it again
    return session


def _fetch_response(version: int, parts: list[Any], tagged_fields: Any = _NO_TAGGED_FIELDS) -> Response:
    """Buffers the Fetch filter encoded, and the tagged-field section that ends them
    (the broker's, or none) for the address filter."""
    return Response.encoded(ApiKey.FETCH, version, parts,
                            tagged_fields=tagged_fields if version >= FLEXIBLE_VERSION else None)


def _as_answered(payload: Buffer, scan: ScannedResponse, version: int) -> Response:
    """The broker's answer as it came, with what the scan found of its tagged fields."""
    return Response.encoded(ApiKey.FETCH, version, [payload], tagged_fields=scan.tagged_fields)
