"""What a response waiting for a slow client may keep alive (`proxy.pinned`)."""

from __future__ import annotations

import socket

from tierproxy.proxy.pinned import PIN_RATIO, socket_room, unpinned


def test_small_runs_of_a_large_buffer_are_copied_and_the_rest_kept() -> None:
    chunk = bytes(range(256)) * 64  # 16 KiB, standing for a 4 MiB chunk
    other = bytearray(b"x" * 1000)
    small = memoryview(chunk)[100:300]  # 200 bytes of 16 KiB: would pin it
    large = memoryview(chunk)[:len(chunk) // 2]  # half of it: kept as a view
    frame = memoryview(other)[:900]  # most of its buffer (a broker frame): kept
    parts = [b"head", small, memoryview(chunk)[300:400], b"mid", large, frame, b"tail"]
    out = unpinned(parts)
    assert b"".join(out) == b"".join(parts)
    assert out[1] == bytes(chunk[100:400]) and isinstance(out[1], bytes)  # the run, joined once
    assert out[3] is large and out[4] is frame
    assert all(isinstance(p, bytes) for p in (out[0], out[2], out[5]))
    assert memoryview(chunk).nbytes > PIN_RATIO * 300


def test_the_socket_says_how_much_it_takes_now() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        client.setblocking(False)
        room = socket_room(client)
        assert room > 0
        # Fill it while nobody reads: the room shrinks to what is left.
        sent = 0
        try:
            while True:
                sent += client.send(b"\0" * 65536)
        except BlockingIOError:
            pass
        assert socket_room(client) < room
        assert socket_room(None) == 0
    finally:
        for sock in (client, accepted, server):
            sock.close()
