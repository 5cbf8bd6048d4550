"""The chunk cache's memory: a pool of chunk-sized buffers, taken once and reused, and the
leases that say which of them a response still sends from.

A chunk read into fresh memory costs the kernel a page fault and a zeroed page for every
4 KiB of it, more than the read's own copy. So the buffers are anonymous mappings whose
pages the kernel zeroes and maps in one call (MAP_POPULATE), allocated up to the cache's
bound by `fill`, which the proxy runs in a thread at start; a load takes a free one, and
an evicted chunk's buffer becomes free again. A load finding none free (the pool not
filled yet, demand loads in flight beyond the bound, or short chunks letting more chunks
than buffers fit the byte bound) maps one more in a thread (`map_one`), which the pool
keeps: it grows to the most it needed at once (the bound and the loads in flight) and
stays there, so a buffer is mapped at most once and never on the event loop.

A response holds memoryview slices of the chunks it sends from. Each holder of slices
takes a lease on their buffer (`ChunkLeases.hold`) and gives it back once the slices are
written or dropped (`ChunkLeases.release`): a buffer whose chunk left the cache is free
again only when its last lease is gone. While a response holds it, its bytes count as
`held_bytes`, which the cache counts against its byte bound: a client that stops reading
holds back at most what the bound allows. A reader that is no response (a Spark task's,
walking a segment's batches) leases the chunks of the batch it was given without
counting them: they are not kept waiting on a client. Ownership is counted here, by the
code that takes and gives back slices, not read off reference counts.
"""

from __future__ import annotations

import collections
import contextvars
import mmap
import threading
from collections.abc import Callable

__all__ = ("ChunkBuffers", "ChunkLeases", "current_leases", "response_leases")

_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)


class ChunkBuffers:
    """Buffers of `size` bytes, `count` of them mapped by `fill`, with a lease count per buffer."""

    def __init__(self, size: int, count: int) -> None:
        if size <= 0 or count < 0:
            raise ValueError(f"size ({size}) must be positive and count ({count}) >= 0")
        self.size = size
        self.count = count
        self._free: collections.deque[mmap.mmap] = collections.deque()
        self._leases: dict[mmap.mmap, int] = {}
        self._responses: dict[mmap.mmap, int] = {}  # the leases of responses among them
        # Buffers that left the cache while leased, with their chunk's bytes.
        self._retired: dict[mmap.mmap, int] = {}
        self.held_bytes = 0  # of retired buffers that responses hold
        self._allocated = 0
        self._lock = threading.Lock()  # `fill` allocates in a thread while loads may take
        self.reused = 0  # buffers handed out again rather than allocated
        self.on_release: Callable[[], None] = lambda: None  # a response gave its last lease on a buffer back
        self.allocated_on_demand = 0  # buffers a load had to map itself

    def fill(self) -> None:
        """Map and fault in the pool's buffers, up to `count`: off the event loop (mmap
        releases the GIL while the kernel populates the pages)."""
        while True:
            with self._lock:
                if self._allocated >= self.count:
                    return
                self._allocated += 1
            self._free.append(mmap.mmap(-1, self.size, flags=_FLAGS))

    def take(self) -> mmap.mmap | None:
        """A free buffer, nothing leasing it; None when the pool has none free (`map_one`)."""
        if self._free:
            self.reused += 1
            return self._free.popleft()
        return None

    def map_one(self) -> mmap.mmap:
        """A newly mapped buffer, for a load that found none free: run it off the event
        loop, as the kernel zeroes and maps its pages."""
        with self._lock:
            self._allocated += 1
            self.allocated_on_demand += 1
        return mmap.mmap(-1, self.size, flags=_FLAGS)

    def retire(self, buffer: mmap.mmap, nbytes: int) -> None:
        """`buffer`'s chunk (`nbytes` of it) left the cache: free now, or once its last lease
        is gone, counting `nbytes` as held while a response holds it."""
        if buffer not in self._leases:
            self._give_back(buffer)
            return
        self._retired[buffer] = nbytes
        if buffer in self._responses:
            self.held_bytes += nbytes

    def acquire(self, buffer: mmap.mmap, *, response: bool = True) -> None:
        self._leases[buffer] = self._leases.get(buffer, 0) + 1
        if response:
            count = self._responses.get(buffer, 0)
            self._responses[buffer] = count + 1
            if not count and buffer in self._retired:
                self.held_bytes += self._retired[buffer]

    def release(self, buffer: mmap.mmap, *, response: bool = True) -> None:
        if response:
            count = self._responses.pop(buffer) - 1
            if count:
                self._responses[buffer] = count
            else:
                if buffer in self._retired:
                    self.held_bytes -= self._retired[buffer]
                self.on_release()
        left = self._leases.pop(buffer) - 1
        if left:
            self._leases[buffer] = left
        elif buffer in self._retired:
            del self._retired[buffer]
            self._give_back(buffer)

    def leased(self, buffer: object) -> bool:
        return buffer in self._leases

    def held_by_response(self, buffer: object) -> bool:
        return buffer in self._responses

    def _give_back(self, buffer: mmap.mmap) -> None:
        self._free.append(buffer)

    def clear(self) -> None:
        with self._lock:
            self._allocated -= len(self._free)
        self._free.clear()

    def __len__(self) -> int:
        """Free buffers."""
        return len(self._free)


class ChunkLeases:
    """The leases one holder of chunk slices (a response, unless `response` is False) took:
    one per buffer, given back together. Once released, holding takes no lease: a read
    that outlived its response (a remote read past `remote.fetch.max.wait.ms` completes in
    the background) sends nothing."""

    __slots__ = ("_held", "_released", "_response")

    def __init__(self, *, response: bool = True) -> None:
        self._held: dict[mmap.mmap, ChunkBuffers] = {}
        self._released = False
        self._response = response

    def hold(self, pool: ChunkBuffers, buffer: mmap.mmap) -> bool:
        """Lease `buffer` of `pool` for this holder (once however many slices it takes)."""
        if self._released:
            return False
        if buffer not in self._held:
            pool.acquire(buffer, response=self._response)
            self._held[buffer] = pool
        return True

    def release_one(self, buffer: mmap.mmap) -> None:
        pool = self._held.pop(buffer, None)
        if pool is not None:
            pool.release(buffer, response=self._response)

    def release(self) -> None:
        """Give every lease back; idempotent."""
        self._released = True
        held, self._held = self._held, {}
        for buffer, pool in held.items():
            pool.release(buffer, response=self._response)

    def __len__(self) -> int:
        return len(self._held)

    @property
    def response(self) -> bool:
        """A response's leases: what they hold counts against the chunk cache's bound."""
        return self._response

    def buffers(self) -> list[mmap.mmap]:
        """The buffers held (a chunk's buffer is chunk-sized, its chunk may be shorter)."""
        return list(self._held)


_RESPONSE_LEASES: contextvars.ContextVar[ChunkLeases | None] = contextvars.ContextVar(
    "tierproxy_response_leases", default=None)


def current_leases() -> ChunkLeases | None:
    """The leases of the response being made in this context, if any."""
    return _RESPONSE_LEASES.get()


def response_leases(leases: ChunkLeases) -> contextvars.Token[ChunkLeases | None]:
    """Make `leases` the holder of every chunk read in this context (and the tasks it
    starts) from now on; the caller owns their release."""
    return _RESPONSE_LEASES.set(leases)
