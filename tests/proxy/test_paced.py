"""Responses written as the client's socket takes them, never copied (`proxy.paced`)."""

from __future__ import annotations

import asyncio
import mmap
import socket
import ssl
from typing import Any

import pytest
import uvloop

from tierproxy.proxy import paced
from tierproxy.proxy.paced import (
    MIN_PIECE,
    WAKE_PIECE,
    PacedWriter,
    copied_for_stalled,
    give_back_paused,
    socket_room,
)


class Leases:
    def __init__(self, *held: object) -> None:
        self.released = 0
        self.held = list(held)  # the chunk buffers held

    def release(self) -> None:
        self.released += 1
        self.held = []

    def buffers(self) -> list[object]:
        return self.held


class SlowTransport(asyncio.WriteTransport):
    """A transport whose socket takes `take` bytes at a time and reports, like asyncio's
    and uvloop's, through the protocol's pause_writing / resume_writing. Its writelines is
    its own (no join), as uvloop's is."""

    def __init__(self, take: int) -> None:
        super().__init__()
        self.take = take
        self.handed: list[Any] = []  # every object given to write / writelines
        self.sent = bytearray()
        self.unsent: list[memoryview] = []
        self.protocol: Any = None
        self.paused = False
        self.limits: tuple[int, int] = (0, 0)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default  # no socket: the writer cannot ask it for room

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.limits = (high or 0, low or 0)

    def get_write_buffer_size(self) -> int:
        return sum(len(view) for view in self.unsent)

    def is_closing(self) -> bool:
        return False

    def write(self, data: Any) -> None:
        self.handed.append(data)
        self.unsent.append(memoryview(data))
        if self.get_write_buffer_size() > self.limits[0] and not self.paused:
            self.paused = True
            self.protocol.pause_writing()

    def writelines(self, list_of_data: Any) -> None:  # type: ignore[override]
        for data in list_of_data:
            self.write(data)

    def drain_some(self) -> None:
        """The socket takes `take` more bytes; the protocol hears once all went out."""
        left = self.take
        while self.unsent and left:
            view = self.unsent[0]
            n = min(left, len(view))
            self.sent += view[:n]
            left -= n
            if n == len(view):
                self.unsent.pop(0)
            else:
                self.unsent[0] = view[n:]
        if not self.unsent and self.paused:
            self.paused = False
            self.protocol.resume_writing()


class JoiningTransport(SlowTransport):
    """writelines as asyncio's selector transport has it before Python 3.12: a join."""

    writelines = asyncio.WriteTransport.writelines  # type: ignore[assignment]


def _writer(transport: SlowTransport, high_water: int = 1 << 30) -> tuple[PacedWriter, list[str]]:
    events: list[str] = []
    writer = PacedWriter(transport, high_water, lambda: events.append("behind"), lambda: events.append("caught up"))
    transport.protocol = writer
    return writer, events


def _of(piece: Any, originals: list[Any]) -> bool:
    """Whether `piece` is one of the originals or a memoryview over one's own memory."""
    if any(piece is original for original in originals):
        return True
    return isinstance(piece, memoryview) and any(
        piece.obj is (original.obj if isinstance(original, memoryview) else original) for original in originals)


@pytest.mark.parametrize("joins", [False, True], ids=["writelines", "write"])
def test_every_byte_arrives_in_order_and_nothing_is_joined(joins: bool) -> None:
    chunk = bytearray(range(256)) * 4096  # 1 MiB, as a remote chunk
    frame = b"broker frame " * 20_000
    first = [b"\x00\x00\x00\x10", memoryview(chunk)[10:300_000], memoryview(chunk)[300_000:900_000], b"tail"]
    second = [memoryview(frame), memoryview(chunk)[5:70_000]]
    transport = (JoiningTransport if joins else SlowTransport)(take=50_000)
    writer, _ = _writer(transport)
    one, two = Leases(), Leases()
    writer.write(first, one)
    writer.write(second, two)
    assert transport.get_write_buffer_size() <= MIN_PIECE  # handed over only what it takes
    rounds = 0
    while transport.unsent:
        transport.drain_some()
        rounds += 1
        assert transport.get_write_buffer_size() <= MIN_PIECE
    expected = b"".join(bytes(part) for part in first + second)
    assert bytes(transport.sent) == expected
    assert rounds > len(expected) // MIN_PIECE // 2  # it went out paced, not at once
    originals = [*first, *second]
    assert all(_of(piece, originals) for piece in transport.handed)
    assert not any(isinstance(piece, (bytes, bytearray)) and len(piece) > 4 for piece in transport.handed
                   if not any(piece is original for original in originals))
    assert one.released == 1 and two.released == 1
    assert writer.pending_bytes == 0


def test_the_writer_paused_longest_gives_its_chunks_back_first_one_at_a_time() -> None:
    """When the chunk cache needs room, one writer a call gives its chunks back: the one
    whose client has taken nothing for longest; a writer whose responses hold no chunk is
    passed over."""
    import gc
    import time

    gc.collect()  # no paused writer of another test is left
    chunks = [mmap.mmap(-1, 1 << 20) for _ in range(3)]
    writers, leases = [], []
    for i, chunk in enumerate(chunks):
        transport = SlowTransport(take=MIN_PIECE)
        writer, _ = _writer(transport)
        held = Leases(chunk) if i else Leases()  # the first one's response holds no chunk
        writer.write([memoryview(chunk)[:1 << 19], memoryview(chunk)[1 << 19:]], held)
        assert transport.paused  # its socket is full
        writers.append(writer)
        leases.append(held)
        time.sleep(0.01)  # each paused after the one before
    assert give_back_paused() > 0
    assert [held.released for held in leases] == [0, 1, 0]
    assert give_back_paused() > 0
    assert [held.released for held in leases] == [0, 1, 1]
    assert give_back_paused() == 0
    for writer, chunk in zip(writers[1:], chunks[1:]):  # what they queue is a copy: the chunk may be reused
        assert not any(isinstance(part, memoryview) and part.obj is chunk
                       for response in writer._queue for part in response.parts)


def test_leases_go_back_only_once_the_transport_sent_the_response() -> None:
    chunk = bytes(300_000)
    transport = SlowTransport(take=100_000)
    writer, _ = _writer(transport)
    leases = Leases()
    writer.write([memoryview(chunk)[:250_000]], leases)
    while transport.unsent:
        assert leases.released == 0
        transport.drain_some()
    assert leases.released == 1


def test_leases_go_back_when_the_connection_is_lost() -> None:
    transport = SlowTransport(take=10)
    writer, _ = _writer(transport)
    written, waiting = Leases(), Leases()
    writer.write([bytes(200_000)], written)
    writer.write([bytes(200_000)], waiting)
    assert written.released == waiting.released == 0
    writer.connection_lost()
    assert written.released == waiting.released == 1
    late = Leases()
    writer.write([b"x"], late)  # after the close: never sent, given back at once
    assert late.released == 1


def test_a_client_behind_by_more_than_the_bound_is_reported_until_it_caught_up() -> None:
    transport = SlowTransport(take=100_000)
    writer, events = _writer(transport, high_water=400_000)
    writer.write([bytes(300_000)])
    assert events == []
    writer.write([bytes(300_000)])
    assert events == ["behind"]
    while transport.unsent:
        transport.drain_some()
    assert events == ["behind", "caught up"]


def test_the_socket_says_how_much_it_takes_now() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        client.setblocking(False)
        room = socket_room(client)
        assert room > 0
        # Fill it while nobody reads: the room shrinks to what is left.
        try:
            while True:
                client.send(b"\0" * 65536)
        except BlockingIOError:
            pass
        assert socket_room(client) < room
        assert socket_room(None) == 0
    finally:
        for sock in (client, accepted, server):
            sock.close()


class _Sink(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.writer: PacedWriter | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.writer = PacedWriter(transport, 1 << 30, lambda: None, lambda: None)  # type: ignore[arg-type]

    def pause_writing(self) -> None:
        assert self.writer is not None
        self.writer.pause_writing()

    def resume_writing(self) -> None:
        assert self.writer is not None
        self.writer.resume_writing()


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_real_transport_sends_everything_in_order_to_a_slow_reader(run: Any) -> None:
    """On a real socket of either loop: a reader that takes its time gets every byte in
    order, and the transport never holds more than a piece of what was not sent yet."""
    chunk = bytes(range(256)) * 40_000  # about 10 MB
    parts = [memoryview(chunk)[i:i + 1_000_000] for i in range(0, len(chunk), 1_000_000)]

    async def main() -> tuple[bytes, int]:
        loop = asyncio.get_running_loop()
        sink = _Sink()
        server = await loop.create_server(lambda: sink, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while sink.writer is None:
            await asyncio.sleep(0.001)
        leases = Leases()
        sink.writer.write(parts, leases)
        received, most_buffered = bytearray(), 0
        while len(received) < len(chunk):
            received += await reader.read(65536)
            most_buffered = max(most_buffered, sink.transport.get_write_buffer_size())
            await asyncio.sleep(0)
        for _ in range(100):
            if leases.released:
                break
            await asyncio.sleep(0.01)
        assert leases.released == 1
        writer.close()
        sink.transport.close()
        server.close()
        return bytes(received), most_buffered

    received, most_buffered = run(main())
    assert received == chunk
    assert most_buffered < len(chunk) // 4


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_client_that_stops_reading_gives_its_chunks_back_when_asked(run: Any) -> None:
    """A reader that stops: the writer is paused, and give_back_paused has it copy the chunk
    slices it queues and give every lease back (the transport holds a copy, never a view of
    a chunk); when the reader reads again every byte arrives, in order."""
    chunk = mmap.mmap(-1, 4 << 20)
    chunk[:] = bytes(range(256)) * (len(chunk) // 256)
    parts = [memoryview(chunk)[i:i + (1 << 20)] for i in range(0, len(chunk), 1 << 20)]
    frame = b"broker frame" * 1000

    async def main() -> tuple[bytes, int, int, bool]:
        loop = asyncio.get_running_loop()
        sink = _Sink()
        server = await loop.create_server(lambda: sink, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        raw = socket.create_connection(("127.0.0.1", port))
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        while sink.writer is None:
            await asyncio.sleep(0.001)
        first, second = Leases(chunk), Leases(chunk)
        sink.writer.write(parts, first)
        sink.writer.write([frame, *parts], second)
        for _ in range(200):  # the reader reads nothing: the writer is paused
            if sink.transport.get_write_buffer_size():
                break
            await asyncio.sleep(0.005)
        stalled = (first.released, second.released) == (0, 0)  # paused, its leases kept until asked
        before = copied_for_stalled()
        copied = give_back_paused()
        assert copied_for_stalled() - before == copied  # what tierproxy_stalled_chunk_bytes_copied counts
        assert give_back_paused() == 0  # nothing left to give back
        released = first.released + second.released
        chunk[:] = b"\xff" * len(chunk)  # the chunk's buffer reused: nothing queued may view it
        raw.setblocking(False)
        received = bytearray()
        expected = 2 * len(chunk) + len(frame)
        while len(received) < expected:
            try:
                data = raw.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.001)
                continue
            if not data:
                break
            received += data
        raw.close()
        sink.transport.close()
        server.close()
        return bytes(received), copied, released, stalled

    original = bytes(range(256)) * (len(chunk) // 256)
    received, copied, released, stalled = run(main())
    assert stalled and released == 2
    assert 0 < copied <= 2 * len(chunk)
    # What the socket had taken before give_back_paused is the original; the rest too,
    # from the copies: the reused buffer's 0xff never reaches the client.
    assert received == original + frame + original


class Spied(asyncio.WriteTransport):
    """A real transport, with the size of everything handed to it recorded; `tls` has it say
    that it encrypts (an SSL context), as a TLS transport over the same socket would."""

    def __init__(self, transport: Any, tls: bool) -> None:
        super().__init__()
        self.transport = transport
        self.tls = tls
        self.handed: list[int] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "sslcontext" and self.tls:
            return ssl.create_default_context()
        return self.transport.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return int(self.transport.get_write_buffer_size())

    def is_closing(self) -> bool:
        return bool(self.transport.is_closing())

    def write(self, data: Any) -> None:
        self.handed.append(len(data))
        self.transport.write(data)

    def writelines(self, list_of_data: Any) -> None:  # type: ignore[override]
        for data in list_of_data:
            self.write(data)

    def close(self) -> None:
        self.transport.close()


class _SpiedSink(_Sink):
    def __init__(self, tls: bool) -> None:
        super().__init__()
        self.tls = tls
        self.spied: Spied | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.spied = Spied(transport, self.tls)
        self.writer = PacedWriter(self.spied, 1 << 30, lambda: None, lambda: None)


def _counting_room(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    asked: list[int] = []
    real_room = paced.socket_room

    def counting_room(sock: Any) -> int:
        asked.append(1)
        return real_room(sock)

    monkeypatch.setattr(paced, "socket_room", counting_room)
    return asked


def test_small_responses_holding_no_chunk_skip_the_sockets_room(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over TLS the tail's responses (small, broker bytes only) go straight to the transport:
    the three system calls of socket_room are for responses that may pin a chunk."""
    asked = _counting_room(monkeypatch)
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()

    class Held(Leases):
        def __len__(self) -> int:
            return 1

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.connect_accepted_socket(lambda: _SpiedSink(tls=True), accepted)
        assert protocol.writer is not None
        for _ in range(50):
            protocol.writer.write([b"\x00\x00\x00\x08", b"response"], None)
        small = len(asked)
        protocol.writer.write([memoryview(bytearray(1000))], Held())
        transport.close()
        return small, len(asked) - small

    small, leased = uvloop.run(main())
    client.close()
    server.close()
    assert small == 0 and leased >= 1


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_plaintext_socket_takes_the_chunks_slices_themselves(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a plaintext connection the writer writes the chunk's slices to the socket itself:
    it never asks the socket for room, the transport is handed only a small copy each time
    the socket is full (so that it says when there is room again), a slow reader gets every
    byte in order, and the leases go back once the kernel took the whole response."""
    asked = _counting_room(monkeypatch)
    chunk = mmap.mmap(-1, 8 << 20)
    chunk[:] = bytes(range(256)) * (len(chunk) // 256)
    parts = [memoryview(chunk)[i:i + (1 << 20)] for i in range(0, len(chunk), 1 << 20)]
    frame = b"broker frame" * 1000

    async def main() -> tuple[bytes, list[int], int]:
        loop = asyncio.get_running_loop()
        sink = _SpiedSink(tls=False)
        server = await loop.create_server(lambda: sink, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        raw = socket.create_connection(("127.0.0.1", port))
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        raw.setblocking(False)
        while sink.writer is None:
            await asyncio.sleep(0.001)
        leases = Leases()
        sink.writer.write([frame, *parts], leases)
        received = bytearray()
        while len(received) < len(frame) + len(chunk):
            try:
                received += raw.recv(64 * 1024)
            except BlockingIOError:
                pass
            await asyncio.sleep(0.0005)  # a reader slower than the writer: the socket fills
        for _ in range(100):
            if leases.released:
                break
            await asyncio.sleep(0.01)
        raw.close()
        assert sink.transport is not None and sink.spied is not None
        sink.transport.close()
        server.close()
        return bytes(received), sink.spied.handed, leases.released

    received, handed, released = run(main())
    assert received == frame + bytes(range(256)) * (len(chunk) // 256)
    assert asked == []
    assert handed and max(handed) <= WAKE_PIECE  # it did fill the socket, and got small copies
    assert sum(handed) < len(received) // 8
    assert released == 1
