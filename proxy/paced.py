"""Responses written to a client as fast as its socket takes them, never copied.

A response is a list of buffers: remote records as memoryview slices of the chunk cache's
chunks, the broker's partitions as slices of its frames. Handing a whole multi-MiB
response to the transport would leave what the socket cannot take at once queued in the
transport: asyncio's selector transport (Python < 3.12) copies it into a bytearray of its
own, and uvloop keeps the slices and with them whole chunks. So the writer keeps the
responses itself, in order, and the transport's write buffer limits are (nearly) 0: it
pauses the writer as soon as it holds anything unsent and resumes it once that went out,
and the writer goes on from there. A slice is never joined with others into new memory.

On a plaintext connection the writer hands the socket the slices itself (`os.writev`, while
the transport holds nothing, so the order stays): the kernel takes what its send buffer
has room for, and the writer cuts a slice where that ended. When the socket is full the
transport is handed a small copy of what comes next (`WAKE_PIECE`): it sends it once the
socket has room and resumes the writer, which pins nothing meanwhile. A TLS transport must
encrypt every byte itself, so there the writer hands the transport only what the socket's
send buffer has room for now (`socket_room`), and a copy of at most MIN_PIECE bytes when it
seems full.

A response may come with leases on the chunks it sends from (`Releasable`): they are
given back once nothing of the response is left unsent but copies or what the kernel holds,
or when the connection closes. A client that stops reading would keep them for good, and
with them room in the chunk cache that other clients need. So what a transport keeps while
its socket is full is a copy, and when the chunk cache finds its bound taken by chunks that
responses hold, `give_back_paused` has the writers paused longest (their transport holds
unsent bytes: the socket is full), one by one until there is room, copy the chunk slices
they still queue and give their leases back: the copies are bounded by the connection's
`max.pending.response.bytes.per.connection`, and a client whose socket takes what it is
sent never has anything copied.

A writer paused for `STALLED_AFTER_S` without its client taking anything is `stalled`: its
connection's remote reads wait behind others' and read no chunks ahead
(`remote_log.reader_pool`). `stalled_chunk_bytes` and `copied_for_stalled` say what such
clients cost: the chunk bytes their responses hold, and the bytes copied for them.
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import mmap
import os
import socket
import struct
import sys
import termios
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

__all__ = ("MIN_PIECE", "PacedWriter", "Releasable", "STALLED_AFTER_S", "WAKE_PIECE", "WireBuffer",
           "copied_for_stalled", "give_back_paused", "socket_room", "stalled_chunk_bytes")

WireBuffer = bytes | bytearray | memoryview
"""What a transport writes: a response's parts as they are."""

MIN_PIECE = 64 * 1024
"""Bytes handed to a transport whose socket seems full, or whose room cannot be known: the
transport queues them and says when they went out."""

WAKE_PIECE = 4096
"""Bytes copied for the transport of a plaintext connection whose socket is full: it sends
them once the socket has room again, and resumes the writer."""

_IOV_MOST = 1024  # buffers one writev takes (Linux's IOV_MAX)

STALLED_AFTER_S = 0.5
"""A writer paused this long (its client took nothing meanwhile) is stalled: a client that
reads takes a socket's worth within milliseconds on any network a Kafka client uses."""

_UNSIGNED = struct.Struct("I")

# The writers of this process whose transport is paused (the client reads slower than
# they write), for give_back_paused.
_paused_writers: weakref.WeakSet[PacedWriter] = weakref.WeakSet()


_copied = 0  # bytes copied for clients whose socket was full, since the process started


def give_back_paused() -> int:
    """The writer paused longest of those whose responses hold chunks copies the chunk slices
    it queues and gives their leases back (see the module's docstring); the bytes copied, at
    least 1 when it gave leases back, 0 when no paused writer holds any. One writer a call,
    so that the chunk cache asks for no more than the room it needs: a writer paused only
    just may have a client that reads, and gives its chunks back soon, but a load waiting
    for that room would wait out its fetch's remote.fetch.max.wait.ms in the meantime."""
    for writer in sorted(_paused_writers, key=lambda w: w.paused_since):
        held = len(set(writer.chunk_buffers()))
        if not held:
            continue
        copied = writer.copy_out()
        if copied or len(set(writer.chunk_buffers())) < held:
            return max(copied, 1)
    return 0


def stalled_chunk_bytes() -> int:
    """Bytes of the chunks that the responses of stalled writers hold now, each chunk once
    however many of them hold it."""
    held: set[object] = set()
    for writer in list(_paused_writers):
        if writer.stalled:
            held.update(writer.chunk_buffers())
    return sum(len(buffer) for buffer in held)  # type: ignore[arg-type, misc]  # chunk buffers have a length


def copied_for_stalled() -> int:
    """Bytes copied so far for clients that do not keep up: chunk slices copied out by `give_back_paused`,
    and pieces handed to the transport of a writer that was last paused for STALLED_AFTER_S
    or longer."""
    return _copied


def _count_copy(nbytes: int) -> None:
    global _copied
    _copied += nbytes


def _views_a_chunk(part: WireBuffer) -> bool:
    return isinstance(part, memoryview) and isinstance(part.obj, mmap.mmap)


def socket_room(sock: socket.socket | None) -> int:
    """Bytes the socket's send buffer takes now without blocking, by a conservative
    reckoning (half its size, as the kernel counts overhead against it, less what is
    queued unsent); 0 when the platform cannot tell."""
    if sock is None:
        return 0
    try:
        size = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        queued = _UNSIGNED.unpack(fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * _UNSIGNED.size))[0]
    except (OSError, AttributeError, ValueError):
        return 0
    return max(size // 2 - queued, 0)


class Releasable(Protocol):
    def release(self) -> None: ...

    def buffers(self) -> Iterable[object]:
        """The chunk buffers held."""
        ...


class _Response:
    __slots__ = ("parts", "index", "offset", "leases")

    def __init__(self, parts: Sequence[WireBuffer], leases: Releasable | None) -> None:
        self.parts = parts
        self.index = 0  # the part to write next
        self.offset = 0  # bytes of it already handed over
        self.leases = leases

    @property
    def holds_chunks(self) -> bool:
        return bool(self.leases)  # leases that hold nothing are empty


class PacedWriter:
    """Writes whole responses, in the order given, to `transport` as its socket takes them.

    `on_behind` is called when more than `high_water` bytes are unsent (held here or in the
    transport), `on_caught_up` when that fell to `high_water // 4` again: the connection's
    `max.pending.response.bytes.per.connection`.
    """

    def __init__(self, transport: asyncio.WriteTransport, high_water: int, on_behind: Callable[[], None],
                 on_caught_up: Callable[[], None]) -> None:
        self._transport = transport
        self._socket: socket.socket | None = transport.get_extra_info("socket")
        # The base class's writelines joins the buffers; uvloop's and 3.12's selector's do not.
        self._writes_lines = type(transport).writelines is not asyncio.WriteTransport.writelines
        self._high_water = high_water
        self._low_water = high_water // 4
        self._on_behind = on_behind
        self._on_caught_up = on_caught_up
        self._queue: collections.deque[_Response] = collections.deque()
        self._queued_bytes = 0  # not handed to the transport yet
        self._handed: list[Releasable] = []  # leases of responses the transport still sends
        self._paused = False  # the transport holds unsent bytes
        self._paused_since = 0.0  # when the transport last paused the writer
        self._was_stalled = False  # the last pause lasted STALLED_AFTER_S or longer
        self._behind = False
        self._closed = False
        self._copy_handed = 0  # bytes of the copy last handed over, when the socket was full
        # A plaintext socket's descriptor: the writer writes to it itself (module docstring).
        self._fd = (self._socket.fileno() if self._socket is not None and hasattr(os, "writev")
                    and transport.get_extra_info("sslcontext") is None else -1)
        # Paused as soon as it holds anything unsent, resumed once it holds nothing: TLS
        # transports pause at `size >= high`, the others at `size > high`, so 1, not 0.
        transport.set_write_buffer_limits(high=1, low=0)

    @property
    def pending_bytes(self) -> int:
        """Bytes of responses not sent yet: held here or queued in the transport."""
        return self._queued_bytes + self._transport.get_write_buffer_size()

    def write(self, parts: Sequence[WireBuffer], leases: Releasable | None = None) -> None:
        """Queue one whole response behind the others and write what the socket takes."""
        if self._closed or not parts:
            if leases is not None:
                leases.release()
            return
        self._queue.append(_Response(parts, leases))
        self._queued_bytes += sum(len(part) for part in parts)
        self._pump()

    @property
    def paused_since(self) -> float:
        """When the transport last paused the writer (time.monotonic)."""
        return self._paused_since

    @property
    def stalled(self) -> bool:
        """Paused for STALLED_AFTER_S or longer: the client is not taking what it is sent."""
        return self._paused and time.monotonic() - self._paused_since >= STALLED_AFTER_S

    def chunk_buffers(self) -> Iterator[object]:
        """The chunk buffers the responses queued here or in the transport hold."""
        for leases in self._handed:
            yield from leases.buffers()
        for response in self._queue:
            if response.leases is not None:
                yield from response.leases.buffers()

    def pause_writing(self) -> None:
        """The transport's pause_writing: it holds unsent bytes."""
        self._paused = True
        self._paused_since = time.monotonic()
        _paused_writers.add(self)

    def resume_writing(self) -> None:
        """The transport's resume_writing: it sent everything it held."""
        self._was_stalled = self.stalled
        self._paused = False
        _paused_writers.discard(self)
        self._release_handed()
        self._pump()

    def close(self, flush: bool) -> None:
        """The connection closes. With `flush` (the transport is closed, not aborted) what
        was not written yet is handed over at once, for the transport to send before it
        closes, and the leases go back once it did (`resume_writing`) or the connection is
        lost (`connection_lost`); without, they go back now."""
        self._closed = True
        transport = self._transport
        if flush and not transport.is_closing():
            while self._queue:
                pieces = self._pieces(sys.maxsize)
                if self._writes_lines:
                    transport.writelines(pieces)
                else:
                    for piece in pieces:
                        transport.write(piece)
            self._release_written()
        else:
            self.connection_lost()

    def copy_out(self) -> int:
        """The chunk slices not handed to the transport yet, copied, and the leases of the
        queued responses given back; the leases of what the transport holds too, since
        what it was handed beyond the socket's room was a copy (not over TLS, whose
        transport may keep what it was handed before it encrypts it), once the transport
        holds no more than that copy (the views handed before it went out whole). The bytes
        copied."""
        copied = 0
        for response in self._queue:
            if response.leases is None:
                continue
            parts = list(response.parts[response.index:])
            if parts and response.offset:
                parts[0] = memoryview(parts[0])[response.offset:]
            for i, part in enumerate(parts):
                if _views_a_chunk(part):
                    parts[i] = bytes(part)
                    copied += len(parts[i])
            response.parts, response.index, response.offset = parts, 0, 0
            response.leases.release()
            response.leases = None
        _count_copy(copied)
        transport = self._transport
        if (self._handed and transport.get_extra_info("sslcontext") is None
                and transport.get_write_buffer_size() <= self._copy_handed):
            self._release_handed()
        return copied

    def connection_lost(self) -> None:
        """Nothing more is sent: every lease goes back."""
        self._closed = True
        _paused_writers.discard(self)
        self._release_handed()
        while self._queue:
            leases = self._queue.popleft().leases
            if leases is not None:
                leases.release()
        self._queued_bytes = 0

    def _pump(self) -> None:
        if self._fd >= 0:
            self._pump_plaintext()
        else:
            self._pump_by_room()
        self._check_behind()

    def _pump_plaintext(self) -> None:
        """Slices to the socket while the transport holds nothing; a small copy to the
        transport once the socket is full, for it to send when there is room."""
        queue = self._queue
        transport = self._transport
        while queue and not self._paused and not self._closed and not transport.is_closing():
            if not transport.get_write_buffer_size():  # so the socket's bytes stay in order
                pieces = self._peek(sys.maxsize, _IOV_MOST)
                try:
                    written = os.writev(self._fd, pieces)
                except OSError:  # full (BlockingIOError), or gone: the transport meets that too, and closes
                    written = 0
                self._advance(written)
                self._release_handed()  # what the kernel took is its own copy
                if written == sum(len(piece) for piece in pieces):
                    continue
            self._hand_copy(WAKE_PIECE)
            self._release_handed()  # the transport holds a copy

    def _pump_by_room(self) -> None:
        queue = self._queue
        transport = self._transport
        while queue and not self._paused and not self._closed and not transport.is_closing():
            if self._socket is None:  # its room cannot be known: a piece, as the socket's own
                room = MIN_PIECE
            elif (self._queued_bytes <= MIN_PIECE and not transport.get_write_buffer_size()
                  and not any(response.holds_chunks for response in queue)):
                # A small response of no chunk (the tail's): the socket takes it, or the
                # transport keeps it pinning nothing; no need to ask the socket for room.
                room = MIN_PIECE
            else:
                room = socket_room(self._socket) - transport.get_write_buffer_size()
            if room <= 0:
                # The transport keeps what the socket cannot take: a copy, not a chunk's view.
                self._copy_handed = self._hand_copy(MIN_PIECE)
            elif self._writes_lines:
                self._copy_handed = 0
                transport.writelines(self._pieces(room))
            else:  # one by one: the transport may pause the writer after any of them
                self._copy_handed = 0
                while room > 0 and queue and not self._paused:
                    (piece,) = self._pieces(room, 1)
                    transport.write(piece)
                    room -= len(piece)
            self._release_written()

    def _hand_copy(self, most: int) -> int:
        """A copy of up to `most` bytes from the head of the queue, handed to the transport
        (which keeps it until the socket takes it); its length."""
        copy = b"".join(self._pieces(most))
        self._transport.write(copy)
        if self._was_stalled:
            _count_copy(len(copy))
        return len(copy)

    def _pieces(self, room: int, most: int = -1) -> list[WireBuffer]:
        """Up to `room` bytes (in at most `most` pieces) taken from the head of the queue."""
        pieces = self._peek(room, most)
        self._advance(sum(len(piece) for piece in pieces))
        return pieces

    def _peek(self, room: int, most: int = -1) -> list[WireBuffer]:
        """Up to `room` bytes (in at most `most` pieces) from the head of the queue, as the
        parts themselves or slices of them; the queue is left as it is."""
        pieces: list[WireBuffer] = []
        for response in self._queue:
            parts, index, offset = response.parts, response.index, response.offset
            while index < len(parts) and room > 0 and len(pieces) != most:
                part = parts[index]
                size = len(part) - offset
                if size <= room and not offset:
                    pieces.append(part)
                else:
                    view = part if isinstance(part, memoryview) else memoryview(part)
                    size = min(size, room)
                    pieces.append(view[offset:offset + size])
                room -= size
                index, offset = index + 1, 0
            if room <= 0 or len(pieces) == most:
                break
        return pieces

    def _advance(self, sent: int) -> None:
        """`sent` bytes of the head of the queue went out (or were copied): past them, and
        past the empty parts that follow."""
        self._queued_bytes -= sent
        queue = self._queue
        while queue:
            response = queue[0]
            left = len(response.parts[response.index]) - response.offset
            if sent < left:
                response.offset += sent
                return
            sent -= left
            response.index += 1
            response.offset = 0
            if response.index == len(response.parts):
                self._finish_head()

    def _finish_head(self) -> None:
        """The head response is cut into pieces whole: its leases wait until what holds its
        slices lets go (the transport; on a plaintext socket the kernel took them already)."""
        leases = self._queue.popleft().leases
        if leases is not None:
            self._handed.append(leases)

    def _release_written(self) -> None:
        if self._handed and not self._transport.get_write_buffer_size():
            self._release_handed()

    def _release_handed(self) -> None:
        handed, self._handed = self._handed, []
        for leases in handed:
            leases.release()

    def _check_behind(self) -> None:
        pending = self.pending_bytes
        if not self._behind and pending > self._high_water:
            self._behind = True
            self._on_behind()
        elif self._behind and pending <= self._low_water:
            self._behind = False
            self._on_caught_up()
