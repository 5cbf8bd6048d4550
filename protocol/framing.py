"""Kafka's size-prefixed framing: a big-endian int32 body size, then the body.

Every request and response travels in one frame. A bad size can never be skipped,
so every problem here is a FrameError and the connection has to be closed.
"""

from __future__ import annotations

import struct

from typing import TYPE_CHECKING, TypeVar

from .errors import FrameError

if TYPE_CHECKING:
    from typing_extensions import Buffer

# A frame keeps its parts' own type (bytes in, bytes out: what writelines is typed to take).
_Part = TypeVar("_Part", bound="Buffer")

__all__ = (
    "DEFAULT_MAX_FRAME_BYTES",
    "SIZE_PREFIX_BYTES",
    "FrameDecoder",
    "encode_frame",
    "split_frames",
)

DEFAULT_MAX_FRAME_BYTES = 104857600
"""The broker's ``socket.request.max.bytes`` default (100 MiB)."""

SIZE_PREFIX_BYTES = 4

_SIZE = struct.Struct(">i")
_MAX_SIZE = 2**31 - 1


def _frame_size(buffer: Buffer, pos: int, max_frame_bytes: int) -> int:
    """The body size announced at ``pos``; refused before any body byte is kept."""
    (size,) = _SIZE.unpack_from(buffer, pos)
    if size < 0:
        raise FrameError(f"negative frame size {size}")
    if size > max_frame_bytes:
        raise FrameError(f"frame size {size} exceeds the maximum of {max_frame_bytes} bytes")
    return size


def _scan(buffer: Buffer, end: int, max_frame_bytes: int) -> tuple[list[tuple[int, int]], int]:
    """Bounds of the complete frame bodies in ``buffer[:end]`` and where the rest starts."""
    bounds = []
    pos = 0
    while end - pos >= SIZE_PREFIX_BYTES:
        size = _frame_size(buffer, pos, max_frame_bytes)
        body_start = pos + SIZE_PREFIX_BYTES
        if end - body_start < size:
            break
        bounds.append((body_start, body_start + size))
        pos = body_start + size
    return bounds, pos


def _truncated(buffer: Buffer, pending: int, max_frame_bytes: int) -> FrameError:
    if pending < SIZE_PREFIX_BYTES:
        return FrameError(f"truncated frame: {pending} of {SIZE_PREFIX_BYTES} size bytes")
    size = _frame_size(buffer, 0, max_frame_bytes)
    return FrameError(f"truncated frame: {pending - SIZE_PREFIX_BYTES} of {size} bytes")


class FrameDecoder:
    """Cuts a byte stream into frame bodies, fed as data arrives.

    Partial data collects in one bytearray (amortised appends, no re-joining of
    chunks). Bodies are handed out as memoryviews into that bytearray; once any frame
    completes, the leftover tail moves to a fresh bytearray and the old one is never
    written again, so the views stay valid for as long as the caller keeps them.
    """

    __slots__ = ("_buffer", "_max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()

    @property
    def max_frame_bytes(self) -> int:
        return self._max_frame_bytes

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        """A new limit applies to the frame being received too (its prefix is re-read)."""
        if not 0 <= value <= _MAX_SIZE:
            raise ValueError(f"max_frame_bytes must be in [0, {_MAX_SIZE}], got {value}")
        self._max_frame_bytes = value

    @property
    def pending_bytes(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return len(self._buffer)

    def feed(self, data: Buffer) -> list[memoryview]:
        """Add received bytes; return the bodies (without size prefix) now complete.

        Raises FrameError as soon as a size prefix is negative or too large.
        """
        buffer = self._buffer
        buffer += data
        bounds, consumed = _scan(buffer, len(buffer), self._max_frame_bytes)
        if not bounds:
            return []
        view = memoryview(buffer)
        # The tail arrived in this call (a frame just completed before it), so the
        # copy costs O(len(data)) at most.
        self._buffer = bytearray(view[consumed:])
        return [view[start:end] for start, end in bounds]

    def at_eof(self) -> None:
        """Check that the stream ended on a frame boundary."""
        if self._buffer:
            raise _truncated(self._buffer, len(self._buffer), self._max_frame_bytes)

    def close(self) -> None:
        """Drop buffered bytes, raising FrameError if they were a truncated frame."""
        try:
            self.at_eof()
        finally:
            self.discard()

    def discard(self) -> None:
        """Drop buffered bytes unchecked: the stream is gone, and with it any use for them."""
        self._buffer = bytearray()


def split_frames(buffer: Buffer, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> list[memoryview]:
    """Bodies of the frames making up a whole buffer (e.g. a captured stream)."""
    view = memoryview(buffer).cast("B")
    bounds, consumed = _scan(view, len(view), max_frame_bytes)
    if consumed != len(view):
        raise _truncated(view[consumed:], len(view) - consumed, max_frame_bytes)
    return [view[start:end] for start, end in bounds]


def encode_frame(*parts: _Part) -> list[_Part | bytes]:
    """The size prefix followed by ``parts``, for ``writelines`` without joining."""
    size = sum(memoryview(part).nbytes for part in parts)
    if size > _MAX_SIZE:
        raise FrameError(f"frame size {size} does not fit the int32 size prefix")
    return [_SIZE.pack(size), *parts]
