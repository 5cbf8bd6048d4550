"""Chunk-sized buffers that the chunk cache reads into and reuses.

A chunk read into fresh memory costs the kernel a page fault and a zeroed page for every
4 KiB of it, more than the read's own copy; reading into a buffer of an evicted chunk
costs neither. A new buffer is an anonymous mapping whose pages the kernel zeroes and
maps in one call (MAP_POPULATE), not page by page as they are first written, and which
no user-space pass zeroes again (as `bytearray(n)` would). A buffer is reused only once nothing views it any more: a response still
waiting to be written holds memoryviews of the chunk it came from, and each keeps a
reference to the buffer, so the buffer's reference count says whether one is alive.
"""

from __future__ import annotations

import collections
import mmap
import sys

__all__ = ("ChunkBuffers",)

# take()'s own reference and getrefcount's argument: nothing else holds the buffer.
_UNREFERENCED = 2
_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)


class ChunkBuffers:
    """Buffers of `size` bytes; at most `keep` evicted ones are kept for reuse."""

    def __init__(self, size: int, keep: int) -> None:
        if size <= 0 or keep < 0:
            raise ValueError(f"size ({size}) must be positive and keep ({keep}) >= 0")
        self.size = size
        self.keep = keep
        self._retired: collections.deque[mmap.mmap] = collections.deque()
        self.reused = 0  # buffers handed out again rather than allocated

    def take(self) -> mmap.mmap:
        """A buffer nothing else references: a retired one when one is free, else a new one."""
        for _ in range(len(self._retired)):
            buffer = self._retired.popleft()
            if sys.getrefcount(buffer) == _UNREFERENCED:
                self.reused += 1
                return buffer
            self._retired.append(buffer)  # a reader still views it: later
        return mmap.mmap(-1, self.size, flags=_FLAGS)

    def retire(self, buffer: mmap.mmap) -> None:
        """`buffer` left the cache: reuse it once its last view is gone (or let it go)."""
        if len(self._retired) < self.keep:
            self._retired.append(buffer)

    def clear(self) -> None:
        self._retired.clear()

    def __len__(self) -> int:
        return len(self._retired)
