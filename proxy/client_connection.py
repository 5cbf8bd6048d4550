"""One client connection and its own upstream connection to the broker it addressed.

The pairing is 1:1: a client on the bootstrap listener gets a connection to one of
the bootstrap brokers, a client on node N's listener a connection to node N. SASL
and ACLs therefore apply to the client's own identity, and correlation ids pass
through unchanged.

The connection behaves like a broker's channel:

- Order: requests are dispatched one by one in the order the client sent them. A
  request that goes through a filter chain mutes the connection until its response
  is ready, so nothing the client sent later reaches the broker before the filters'
  own requests do. Requests passed through are pipelined (the broker orders them itself).
  Responses go back in request order (``ResponseOrderer``).
- Backpressure: responses go out as fast as the client's socket takes them, never
  copied (``PacedWriter``). The proxy stops reading a client while a request waits to be
  dispatched, while more than ``max.pending.response.bytes.per.connection`` of
  responses are unsent to it, while ``max.in.flight.requests.per.connection``
  requests are unanswered, or while the broker is not reading. A client that does
  not read its responses therefore holds at most one response beyond that bound; the
  remote chunks its responses send from stay leased (``cache.chunk_buffers``) until
  they are written or the connection closes, within the chunk cache's bound. Such a
  connection is ``stalled``: remote reads still to run for it wait behind other
  connections' in the reader pool, whose turns go round the connections. One with a Fetch
  waiting behind the request in hand is ``pipelining`` (Kafka's consumers keep one Fetch in
  flight per broker): a full reader queue refuses its reads before those of connections
  that do neither.
- Limits: the frame bound and the requests allowed are the authentication gate's
  (``socket.request.max.bytes``; before a SASL login ``sasl.server.max.receive.size``
  whenever the listener may want one, see ``proxy.authentication``),
  ``connections.max.idle.ms`` and ``request.receive.timeout.ms`` (checked by the
  server, ``check_timeouts``). A new connection over ``max.connection.creation.rate``
  waits for its turn (``ConnectionServer.connection_delay``) before anything is read.

Nothing here is specific to an API: a request whose API key and version have filters
goes through their chain (``proxy.filters``), every other one is forwarded as an
opaque frame whose header is peeked for the API key, version and correlation id; the
wire says whether a response will come (``protocol.acks``). One that gets none meets no
chain, only the filters that must admit it (``Filter.admit``), when there are any. One
that every filter of its chain lets pass (``Filter.pass_through``: a Fetch at the tail)
is forwarded as it came, its header peeked once, with no task: the connection stays
muted as for a chain, and when the answer comes the filters' checks say, there and then,
whether it goes back as it came or the chain takes it from there. Both sides are asyncio
Protocols: ``data_received`` only feeds a FrameDecoder.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import struct
import time

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from tierproxy.protocol.acks import expects_response
from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.errors import DecodeError, FrameError, ProtocolError
from tierproxy.protocol.framing import FrameDecoder, encode_frame
from tierproxy.protocol.headers import (
    RequestHeader,
    encode_response_header,
    parse_response_header,
    peek_request_header,
    response_header_version,
)

from .authentication import ResponseObserver, UnauthenticatedRequest, UpstreamListener
from .filters import (
    AnswerCheck,
    ClientRequest,
    ConnectionContext,
    Filter,
    InvalidRequest,
    ProxyServices,
    RefusedRequest,
    Response,
    as_answered,
    pass_through,
    run_chain,
)
from .metrics import api_name
from .ordering import ResponseOrderer, ResponseSlot
from .paced import PacedWriter, Releasable
from tierproxy.cache.chunk_buffers import ChunkLeases, response_leases
from tierproxy.remote_log.reader_pool import read_owner
from tierproxy.config import (MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, MAX_PENDING_RESPONSE_BYTES_PER_CONNECTION,
                              SOCKET_SEND_BUFFER_BYTES)

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ("ClientConnection", "ConnectionServer", "UpstreamClosed")

log = logging.getLogger(__name__)

# The broker side's write buffer above this stops the client's reads.
WRITE_HIGH_WATER = 1024 * 1024
# Responses are as large as the client's fetch.max.bytes asks; only the int32 bounds them.
MAX_RESPONSE_BYTES = 2**31 - 1

_INT32 = struct.Struct(">i")
_FETCH = int(ApiKey.FETCH)  # below 256: the API key's high byte is 0


class UpstreamClosed(ConnectionError):
    """The client's upstream connection is gone; a forward() cannot complete."""


class ConnectionServer(Protocol):
    """What a client connection needs of the server that accepted it."""

    services: ProxyServices
    upstream: UpstreamListener
    """Whether the brokers' listener wants SASL: the gates of new connections."""

    def connection_opened(self, connection: ClientConnection) -> str | None:
        """Admit the connection, or name the limit that refuses it."""
        ...

    def connection_delay(self) -> float:
        """Seconds an admitted connection waits for its turn (max.connection.creation.rate)."""
        ...

    def connection_closed(self, connection: ClientConnection) -> None: ...

    def upstream_addresses(self, node_id: int | None) -> list[tuple[str, int]]:
        """The broker addresses to try, in order, for a client of this listener."""
        ...

    async def open_upstream(self, factory: Callable[[], Any], host: str, port: int) -> tuple[Any, Any]:
        """(transport, protocol) of a new connection to the broker at host:port."""
        ...


class _InFlight:
    """A request sent upstream whose response is awaited, in send order."""

    __slots__ = ("api_key", "api_version", "correlation_id", "future", "slot", "observer", "passed")

    def __init__(self, correlation_id: int, api_key: int, api_version: int, slot: ResponseSlot | None,
                 future: asyncio.Future[memoryview] | None, observer: ResponseObserver | None = None,
                 passed: _Passed | None = None) -> None:
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.api_version = api_version
        self.slot = slot  # pass-through: the response goes to the client as is
        self.future = future  # a filter's forward() waits on it
        self.observer = observer  # the authentication gate's, for the requests it tracks
        self.passed = passed  # its filters let it pass: their checks look at the answer


class _Passed:
    """A request the filters of its chain let pass (``Filter.pass_through``)."""

    __slots__ = ("chain", "request", "checks")

    def __init__(self, chain: tuple[Filter, ...], request: ClientRequest, checks: tuple[AnswerCheck, ...]) -> None:
        self.chain = chain
        self.request = request
        self.checks = checks


class _Upstream(asyncio.Protocol):
    """The broker side of one ClientConnection."""

    def __init__(self, owner: ClientConnection) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(MAX_RESPONSE_BYTES)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream connection's
        _tune(self.transport)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except FrameError as e:
            self.owner.close(f"bad frame from broker: {e}", level=logging.ERROR)
            return
        on_response = self.owner.on_response
        for body in frames:
            on_response(body)

    def eof_received(self) -> bool:
        try:
            self.decoder.at_eof()
        except FrameError as e:
            self.owner.close(f"broker closed the connection inside a frame: {e}", level=logging.WARNING)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.decoder.discard()
        reason = f"broker closed the connection ({exc})" if exc else "broker closed the connection"
        self.owner.broker_closed()
        self.owner.close(reason, level=logging.INFO, flush=True)

    def pause_writing(self) -> None:
        self.owner.block_client_reads("upstream write buffer full")

    def resume_writing(self) -> None:
        self.owner.unblock_client_reads("upstream write buffer full")


def _tune(transport: asyncio.Transport, high_water: int = WRITE_HIGH_WATER) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        # Kafka requests and responses are small and latency-bound.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport.set_write_buffer_limits(high=high_water, low=high_water // 4)


def _send_buffer(transport: asyncio.Transport, size: int) -> None:
    """SO_SNDBUF as Kafka's broker sets it, unless -1 (the kernel's autotuning: a buffer
    of up to megabytes that takes a response out of the chunk cache's leases at once, but
    keeps it in kernel memory for a client that does not read)."""
    sock = transport.get_extra_info("socket")
    if size != -1 and sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        except OSError:  # not a socket option this transport's socket has
            pass


def _as_parts(data: Buffer | Sequence[Buffer]) -> list[Buffer]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return [data]
    return list(data)  # type: ignore[arg-type]  # not one buffer, so a sequence of them


class ClientConnection(asyncio.Protocol):
    """A client of one proxy listener, paired with its own broker connection."""

    def __init__(self, server: ConnectionServer, node_id: int | None) -> None:
        self.server = server
        self.node_id = node_id
        self.listener = "bootstrap" if node_id is None else f"node-{node_id}"
        self.peer = "?"
        self.ip = "?"
        self.ctx: ConnectionContext | None = None
        services = server.services
        config = services.config
        self._filters = services.filters
        self._metrics = services.metrics
        self._max_pending_response_bytes: int = config[MAX_PENDING_RESPONSE_BYTES_PER_CONNECTION]
        self._max_in_flight: int = config[MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION]
        self._send_buffer_bytes: int = config[SOCKET_SEND_BUFFER_BYTES]
        # The gate of the listener as known now; the one the connection keeps is made once
        # the proxy asked (if it must) and the broker connection exists (_connect_upstream).
        self._gate = server.upstream.gate()
        self._decoder = FrameDecoder(self._gate.max_frame_bytes)
        self._client: asyncio.Transport | None = None
        self._writer: PacedWriter | None = None
        self._upstream: _Upstream | None = None
        self._orderer = ResponseOrderer(self._write_client)
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        # Requests read but not dispatched yet: behind a request being handled, or
        # waiting for the client to read its responses.
        self._waiting: collections.deque[memoryview] = collections.deque()
        self._handling = False  # a filter chain has the connection muted
        self._client_behind = False  # more unsent responses than the bound
        self._tasks: set[asyncio.Task[Any]] = set()
        self._read_blockers: set[str] = set()
        self._closed = False
        self._last_activity = time.monotonic()
        self._frame_started: float | None = None  # when the frame being received began
        # Bytes that came before the broker connection and the gate were ready: uvloop
        # reads once even when connection_made paused reading.
        self._early: list[bytes] | None = []

    # --- client side -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        client = self._client = cast(asyncio.Transport, transport)  # a stream connection's
        _tune(client)
        _send_buffer(client, self._send_buffer_bytes)
        self._writer = PacedWriter(client, self._max_pending_response_bytes, self._client_fell_behind,
                                   self._client_caught_up)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.ip = peer[0] if isinstance(peer, tuple) else str(peer)
        self._metrics.connections.labels(self.listener).inc()
        refusal = self.server.connection_opened(self)
        if refusal is not None:
            self._closed = True
            self._metrics.connections_rejected.labels(refusal).inc()
            client.abort()
            return
        self._metrics.connections_active.labels(self.listener).inc()
        # Nothing is read until the broker connection exists to forward it to, nor before
        # the connection's turn under max.connection.creation.rate.
        self.block_client_reads("connecting to broker")
        self._spawn(self._connect_upstream(self.server.connection_delay()))

    async def _connect_upstream(self, delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)
        errors = []
        await self.server.upstream.settle()
        self._gate = self.server.upstream.gate()
        self._decoder.max_frame_bytes = self._gate.max_frame_bytes
        for host, port in self.server.upstream_addresses(self.node_id):
            try:
                transport, upstream = await self.server.open_upstream(lambda: _Upstream(self), host, port)
            except (OSError, asyncio.TimeoutError) as e:
                errors.append(f"{host}:{port}: {e or type(e).__name__}")
                continue
            if self._closed:
                transport.close()
                return
            self._upstream = upstream
            self.ctx = ConnectionContext(peer=self.peer, node_id=self.node_id, broker=(host, port),
                                         services=self.server.services, forward=self.forward)
            early, self._early = self._early or [], None
            for data in early:  # now held to the gate's bound
                self.data_received(data)
            self.unblock_client_reads("connecting to broker")
            self._dispatch_waiting()
            return
        self.close("cannot connect to the broker: " + ("; ".join(errors) or "no broker address known"),
                   level=logging.WARNING)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        if self._early is not None:
            self._early.append(data)
            if self._client is not None:
                self._client.pause_reading()  # takes effect once reading has begun
            return
        self._metrics.client_bytes_in.inc(len(data))
        now = self._last_activity = time.monotonic()
        decoder = self._decoder
        try:
            frames = decoder.feed(data)
        except FrameError as e:
            self.close(f"bad frame ({self._gate.bound}): {e}", level=logging.WARNING, label="bad_request")
            return
        if not decoder.pending_bytes:
            self._frame_started = None
        elif frames or self._frame_started is None:
            self._frame_started = now
        if frames:
            self._waiting.extend(frames)
            self._dispatch_waiting()

    def eof_received(self) -> bool:
        try:
            self._decoder.at_eof()
        except FrameError as e:
            self.close(f"bad frame at end of stream: {e}", level=logging.WARNING, label="bad_request")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._writer is not None:
            self._writer.connection_lost()
        # A client that resets is an everyday event (and one a hostile client repeats
        # hundreds of times a second): DEBUG, as Kafka's Selector logs a disconnection.
        self.close(f"client connection lost ({exc})" if exc else None, level=logging.DEBUG)

    def pause_writing(self) -> None:
        if self._writer is not None:
            self._writer.pause_writing()

    def resume_writing(self) -> None:
        if self._writer is not None:
            self._writer.resume_writing()

    @property
    def stalled(self) -> bool:
        """The client is not reading its responses: more than the pending bound is unsent,
        or its socket has taken nothing for a while (`paced.STALLED_AFTER_S`)."""
        return self._client_behind or (self._writer is not None and self._writer.stalled)

    @property
    def pipelining(self) -> bool:
        """The client sent a Fetch that waits behind the request in hand: Kafka's consumers
        keep one Fetch in flight per broker, so this is a client that pipelines them. Asked
        only when the reader queue is full, so the waiting requests are looked at then, not
        counted as each one arrives."""
        return any(_is_fetch(body) for body in self._waiting)

    def _client_fell_behind(self) -> None:
        # The client is not reading: neither its requests nor its broker's responses are.
        self._client_behind = True
        self.block_client_reads("responses unsent")
        if self._upstream is not None and self._upstream.transport is not None:
            self._upstream.transport.pause_reading()

    def _client_caught_up(self) -> None:
        self._client_behind = False
        if self._closed:
            return
        if self._upstream is not None and self._upstream.transport is not None:
            self._upstream.transport.resume_reading()
        self.unblock_client_reads("responses unsent")
        self._dispatch_waiting()

    def block_client_reads(self, reason: str) -> None:
        if not self._read_blockers and self._client is not None and not self._closed:
            self._client.pause_reading()
        self._read_blockers.add(reason)

    def unblock_client_reads(self, reason: str) -> None:
        if reason not in self._read_blockers:
            return
        self._read_blockers.discard(reason)
        if not self._read_blockers and self._client is not None and not self._closed:
            self._client.resume_reading()
            # Time the proxy spent not reading is not the client's.
            self._last_activity = time.monotonic()
            if self._frame_started is not None:
                self._frame_started = self._last_activity

    def check_timeouts(self, now: float, idle_s: float, receive_s: float) -> None:
        """Close the connection if it is idle, or if a frame is stuck half-received."""
        if self._closed or self._read_blockers:
            return  # the proxy itself is not reading, or is still connecting
        started = self._frame_started
        if started is not None and now - started > receive_s:
            self.close(f"request not complete within request.receive.timeout.ms ({receive_s * 1000:.0f} ms): "
                       f"{self._decoder.pending_bytes} bytes of a frame so far", level=logging.WARNING,
                       label="timeout")
        elif not self._orderer and not self._handling and now - self._last_activity > idle_s:
            self.close(f"idle for connections.max.idle.ms ({idle_s * 1000:.0f} ms)", label="idle")

    # --- requests ----------------------------------------------------------------------

    def _dispatch_waiting(self) -> None:
        """Dispatch waiting requests in order as far as the channel's limits allow; the
        client is not read while any must wait."""
        waiting = self._waiting
        while waiting and not self._closed:
            if (self._handling or self._client_behind or self._upstream is None
                    or len(self._orderer) >= self._max_in_flight):
                break
            self._on_request(waiting.popleft())
        if self._closed:
            return
        if waiting:
            self.block_client_reads("requests waiting")
        else:
            self.unblock_client_reads("requests waiting")

    def _on_request(self, body: memoryview) -> None:
        gate = self._gate
        try:
            header = peek_request_header(body)
            observer = gate.check_request(header, body)
            if not expects_response(header, body):  # none may be waited for
                self._unanswered(header, body)
                return
        except ProtocolError as e:
            self.close(f"malformed request: {e}", level=logging.WARNING, label="bad_request")
            return
        except UnauthenticatedRequest as e:
            self.close(str(e), level=logging.WARNING, label="unauthenticated")
            return
        slot = self._orderer.reserve(header.api_key, header.correlation_id)
        chain = self._filters.chain(header.api_key, header.api_version) if gate.filtered(header.api_key) else ()
        if not chain:
            self._metrics.forwarded(header.api_key)
            self._send_upstream(encode_frame(body), _InFlight(
                header.correlation_id, header.api_key, header.api_version, slot, None, observer))
            return
        self._metrics.intercepted(header.api_key)
        self._handling = True  # until the answer went out, as for a chain
        request = ClientRequest(header, body)
        checks = None
        if self._filters.may_pass(header.api_key, header.api_version):
            assert self.ctx is not None, "requests are handled only once the broker connection exists"
            try:
                checks = pass_through(chain, self.ctx, request)
            except Exception as e:
                self._filters_failed(chain, header, e)
                return
        if checks is None:
            self._spawn(self._filter(chain, request, slot))
        else:
            self._send_upstream(encode_frame(body), _InFlight(
                header.correlation_id, header.api_key, header.api_version, slot, None, passed=_Passed(
                    chain, request, checks)))

    def _unanswered(self, header: RequestHeader, body: memoryview) -> None:
        """A request that gets no response: forwarded at once, unless filters must admit
        it first (then the connection is muted until they did, as for a chain)."""
        admitting = self._filters.admitting(header.api_key, header.api_version) \
            if self._gate.filtered(header.api_key) else ()
        if not admitting:
            self._metrics.forwarded(header.api_key)
            self._send_upstream(encode_frame(body), None)
            return
        self._metrics.intercepted(header.api_key)
        self._handling = True
        self._spawn(self._admit(admitting, header, body))

    async def _admit(self, filters: tuple[Filter, ...], header: RequestHeader, body: memoryview) -> None:
        assert self.ctx is not None, "requests are handled only once the broker connection exists"
        request = ClientRequest(header, body)
        try:
            for filter_ in filters:
                await filter_.admit(self.ctx, request)
        except Exception as e:
            self._filters_failed(filters, header, e)
            return
        if self._closed:
            return
        self._send_upstream(encode_frame(body), None)
        self._handling = False
        self._dispatch_waiting()

    async def _filter(self, chain: tuple[Filter, ...], request: ClientRequest, slot: ResponseSlot) -> None:
        assert self.ctx is not None, "requests are handled only once the broker connection exists"
        header = request.header
        # Every remote chunk read for this response is leased to it until it is written.
        leases = ChunkLeases()
        response_leases(leases)
        read_owner(self)  # its remote reads take this connection's turns in the reader pool
        answered = False
        try:
            response = await run_chain(chain, self.ctx, request)
            parts = self._response_frame(header, response)
            answered = not self._closed
        except Exception as e:
            self._filters_failed(chain, header, e)
            return
        finally:
            if not answered:  # no response goes out (a cancelled task's included)
                leases.release()
        if not answered:
            return
        self._handling = False
        self._orderer.complete(slot, parts, leases)
        self._dispatch_waiting()

    def _filters_failed(self, filters: tuple[Filter, ...], header: RequestHeader, error: Exception) -> None:
        """Close the connection whose request the filters could not handle, saying why."""
        request = f"{api_name(header.api_key)} v{header.api_version} request (correlation id {header.correlation_id})"
        if isinstance(error, UpstreamClosed):
            return  # the connection is closing; its log line says why
        if isinstance(error, InvalidRequest):
            self.close(f"malformed {request}: {error}", level=logging.WARNING, label="bad_request")
        elif isinstance(error, RefusedRequest):
            self.close(f"refused {request}: {error}", level=logging.WARNING, label="refused")
        else:
            names = ", ".join(map(repr, filters))
            log.error("client %s (%s): the filters %s failed on %s", self.peer, self.listener, names, request,
                      exc_info=error)
            self.close(f"{names} failed: {type(error).__name__}: {error}", level=logging.ERROR)

    @staticmethod
    def _response_frame(header: RequestHeader, response: Response) -> list[Buffer]:
        if (response.api_key, response.api_version) != (header.api_key, header.api_version):
            raise TypeError(f"a {api_name(response.api_key)} v{response.api_version} response answers "
                            f"{api_name(header.api_key)} v{header.api_version}")
        header_version = response_header_version(header.api_key, header.api_version)
        if header_version is None:
            raise TypeError(f"no response header version for {api_name(header.api_key)} v{header.api_version}")
        return encode_frame(encode_response_header(header.correlation_id, header_version), *response.parts)

    async def forward(self, request: Buffer | Sequence[Buffer]) -> memoryview:
        """Send a request frame body upstream; return the broker's response payload."""
        if self._closed:
            raise UpstreamClosed(f"connection of client {self.peer} is closed")
        parts = _as_parts(request)
        try:
            header = peek_request_header(parts[0])
        except DecodeError:
            header = peek_request_header(b"".join(parts))  # the header spans parts
        future: asyncio.Future[memoryview] = asyncio.get_running_loop().create_future()
        self._send_upstream(
            encode_frame(*parts), _InFlight(header.correlation_id, header.api_key, header.api_version, None, future))
        return await future

    def _send_upstream(self, parts: list[Buffer], in_flight: _InFlight | None) -> None:
        upstream = self._upstream
        assert upstream is not None and upstream.transport is not None
        if in_flight is not None:
            self._in_flight.append(in_flight)
        upstream.transport.writelines(parts)  # type: ignore[arg-type]  # transports take any byte buffer; typeshed names only bytes, bytearray, memoryview

    # --- responses ---------------------------------------------------------------------

    def on_response(self, body: memoryview) -> None:
        if self._closed:
            return
        if not self._in_flight:
            self.close("broker sent a response to no request", level=logging.ERROR)
            return
        in_flight = self._in_flight.popleft()
        if len(body) < 4:
            self.close(f"broker sent a {len(body)}-byte response", level=logging.ERROR)
            return
        (correlation_id,) = _INT32.unpack_from(body, 0)
        if correlation_id != in_flight.correlation_id:
            self.close(f"broker answered correlation id {correlation_id}, expected {in_flight.correlation_id} "
                       f"({api_name(in_flight.api_key)})", level=logging.ERROR)
            return
        gate = self._gate
        if gate.learning and gate.answered(in_flight.api_key):
            self._decoder.max_frame_bytes = gate.max_frame_bytes
        if in_flight.passed is not None:
            self._passed_answered(in_flight, body)
            return
        if in_flight.slot is not None:
            if in_flight.observer is not None:
                try:
                    in_flight.observer(body)
                except ProtocolError as e:
                    self.close(f"bad {api_name(in_flight.api_key)} response from broker: {e}", level=logging.ERROR)
                    return
                self._decoder.max_frame_bytes = self._gate.max_frame_bytes
            self._orderer.complete(in_flight.slot, encode_frame(body))
            return
        future = in_flight.future
        assert future is not None
        if future.done():
            return
        try:
            payload = _response_payload(in_flight.api_key, in_flight.api_version, body)
        except ProtocolError as e:
            future.set_exception(e)
            return
        future.set_result(payload)

    def _passed_answered(self, in_flight: _InFlight, body: memoryview) -> None:
        """The broker answered a request its filters let pass: back as it came when their
        checks say so, else to the chain, which takes the answer as the broker's."""
        passed = in_flight.passed
        slot = in_flight.slot
        assert passed is not None and slot is not None
        request = passed.request
        header = request.header
        try:
            answer = Response.encoded(header.api_key, header.api_version,
                                      [_response_payload(header.api_key, header.api_version, body)])
            as_is = as_answered(passed.checks, answer)
        except Exception as e:
            self._filters_failed(passed.chain, header, e)
            return
        if not as_is:
            request.answer = answer
            self._spawn(self._filter(passed.chain, request, slot))
            return
        self._handling = False
        self._orderer.complete(slot, encode_frame(body))
        self._dispatch_waiting()

    def _write_client(self, parts: Sequence[Buffer], leases: Releasable | None) -> None:
        writer = self._writer
        if writer is None or self._closed:
            if leases is not None:
                leases.release()
            return
        self._last_activity = time.monotonic()
        size = sum(len(part) for part in parts)  # type: ignore[arg-type, misc]  # byte buffers: len is the size
        self._metrics.client_bytes_out.inc(size)
        writer.write(parts, leases)  # type: ignore[arg-type]  # every response part is bytes or a memoryview
        if self._waiting and len(self._orderer) < self._max_in_flight:
            asyncio.get_running_loop().call_soon(self._dispatch_waiting)

    # --- closing -----------------------------------------------------------------------

    def broker_closed(self) -> None:
        """The broker, not the proxy, closed the upstream connection: the gate may learn
        from it whether the listener wants SASL."""
        gate = self._gate
        if not self._closed and gate.learning:
            gate.broker_closed()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self, reason: str | None = None, *, level: int = logging.INFO, flush: bool = False,
              label: str | None = None) -> None:
        """Close both sides. ``flush`` lets the client read what was already written to
        it (a broker's last answer, e.g. a failed authentication); a bad frame aborts."""
        if self._closed:
            return
        self._closed = True
        if reason is not None:
            log.log(level, "client %s (%s): closing: %s", self.peer, self.listener, reason)
        self._metrics.connections_active.labels(self.listener).dec()
        self._metrics.connections_closed.labels(label or _reason_label(reason, level)).inc()
        self.server.connection_closed(self)
        # What was received and not yet answered goes now: the connection and its broker
        # side refer to each other, so without this a frame cut short (up to
        # socket.request.max.bytes, sent before any login) would stay until the cyclic
        # collector ran.
        self._decoder.discard()
        self._waiting.clear()
        self._early = None
        self.ctx = None
        self._orderer.clear()
        graceful = flush or level <= logging.INFO
        if self._writer is not None:
            self._writer.close(flush=graceful)
        error = UpstreamClosed(reason or "client closed the connection")
        while self._in_flight:
            future = self._in_flight.popleft().future
            if future is not None and not future.done():
                future.set_exception(error)
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        if self._upstream is not None:
            self._upstream.decoder.discard()
            if self._upstream.transport is not None:
                self._upstream.transport.close()
        if self._client is not None:
            if graceful:
                self._client.close()
            else:
                self._client.abort()


def _is_fetch(body: memoryview) -> bool:
    """Whether a request frame body is a Fetch (its API key, the header's first int16)."""
    return len(body) >= 2 and body[0] == 0 and body[1] == _FETCH


def _response_payload(api_key: int, api_version: int, body: memoryview) -> memoryview:
    """A response frame body without its response header. Raises ProtocolError."""
    header_version = response_header_version(api_key, api_version)
    if header_version is None:
        raise DecodeError(f"no response header version for {api_name(api_key)} v{api_version}")
    _, offset = parse_response_header(body, header_version)
    return body[offset:]


def _reason_label(reason: str | None, level: int) -> str:
    if reason is None or level <= logging.INFO:
        return "closed"
    if reason.startswith("cannot connect"):
        return "broker_unreachable"
    return "error"
