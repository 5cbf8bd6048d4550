"""Responses that would pin large buffers while they wait for a slow client.

A response is written as buffers (`writelines`): remote records as memoryview slices of
the chunk cache's chunks, the broker's partitions as slices of its frames. What the
socket takes at once costs nothing; what it cannot take waits in the transport's queue,
and every slice there keeps the whole buffer it views alive. So before a response is
written, the client connection asks whether the socket has room for all of it; only
when it has not are the slices that view a much larger buffer (a few batches of a 4 MiB
chunk) copied, so that a response waiting for a slow client keeps at most PIN_RATIO times
its own bytes in memory, not whole chunks.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ("PIN_RATIO", "socket_room", "unpinned")

PIN_RATIO = 4
"""A slice that would keep a buffer more than this many times its size alive is copied."""

_UNSIGNED = struct.Struct("I")


def socket_room(sock: socket.socket | None) -> int:
    """Bytes the socket's send buffer takes now without blocking, by a conservative
    reckoning (half its size, as the kernel counts overhead against it, less what is
    queued unsent); 0 when the platform cannot tell."""
    if sock is None:
        return 0
    try:
        size = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        queued = _UNSIGNED.unpack(fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * _UNSIGNED.size))[0]
    except (OSError, AttributeError):
        return 0
    return max(size // 2 - queued, 0)


def unpinned(parts: Sequence[Buffer]) -> list[Buffer]:
    """`parts` with every run of slices that views a buffer more than PIN_RATIO times the
    run's size copied into one bytes object; everything else as it was."""
    out: list[Buffer] = []
    run: list[memoryview] = []

    def flush() -> None:
        owner = memoryview(run[0].obj).nbytes
        size = sum(view.nbytes for view in run)
        out.extend([b"".join(run)] if size * PIN_RATIO < owner else run)
        run.clear()

    for part in parts:
        if isinstance(part, memoryview) and part.obj is not None:
            if run and part.obj is not run[0].obj:
                flush()
            run.append(part)
            continue
        if run:
            flush()
        out.append(part)
    if run:
        flush()
    return out
