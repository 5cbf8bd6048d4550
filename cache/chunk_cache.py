"""A remote segment's `.log` bytes in fixed, aligned chunks, bounded by bytes, with read-ahead.

Chunk i of a segment covers bytes [i * chunk_size, (i + 1) * chunk_size) of its
`.log`; the last chunk is short (the segment's size is in its metadata). A chunk
is read with one ranged read into a chunk-sized buffer of the cache's pool
(`chunk_buffers`: taken once, at start, and reused), and readers slice it with
memoryviews. `get` leases the chunk's buffer to the response being made (`ChunkLeases`,
the context's or one given): a chunk evicted while a response still holds slices of it
stays in its buffer, counted as held, until the response gave the lease back; only then
is the buffer reused.

Object stores answer the first byte after 10-50 ms. When chunk i is read, chunks
i+1 .. i+N are fetched in the background, so a sequential reader finds them ready: N is
`read_ahead_chunks` for `get`'s own read-ahead, and the remote log reader asks `prefetch`
for as many as the store's observed first-byte latency needs (remote_log/read_ahead.py),
into the next segment too. Where the store reads runs with one request (`reads_runs`: an
object store, whose every request costs about as much CPU as a few MiB of its bytes),
consecutive chunks of one segment that a prefetch starts are read `chunks_per_read` at a
time with one ranged read: each is cached, and its waiters served, as soon as its own
bytes are in and checked. A read that fails fails the chunk it was filling and those
after it; after a corrupt block, the chunks after that one load alone.
The cache holds two kinds of chunks within one byte bound:

- read chunks, in least-recently-used order;
- prefetched chunks nobody has read yet, in the order they arrived. A read moves
  a chunk to the first kind.

Speculation gives way to demand: a chunk a reader waited for evicts prefetched
chunks first, then the least recently read ones. A prefetch reserves its bytes
before it starts (evicting read chunks only, never other prefetched ones) and is
skipped when there is no room; at most `max_prefetch_per_segment` reads (a chunk or a
run) run at once per segment. Chunks that a holder leases (cached and leased, or evicted
and still held) are never evicted to make room, and those that responses hold count
against the bound:
`stored + held + reserved <= max_bytes`, but for chunks of demand loads that did not fit
beside the prefetches in flight and are served without being kept (at most one per
demand load in flight). A demand load that finds the bound full of what responses hold
(clients that stopped reading) waits for them to give chunks back as long as its read's
deadline allows (`storage.backoff.read_deadline`: the fetch's remote.fetch.max.wait.ms,
which then answers empty records), then fails with ChunkCacheFull, retriable, for that
read only; a chunk still cached is served all the same. A load for a response that already
holds chunks does not wait: it fails at once with ResponseCutShort, and the response goes
out with what it holds. Responses that each hold part of the bound and wait for the rest
would otherwise wait for one another (a Fetch's partitions are read concurrently, each
holding its chunks until the whole response is written) until every one of them expires.

A chunk whose load meets a corrupt block (the store checks each block as it streams
it) is neither cached nor returned: `get` raises CorruptChunk, which carries the
checked bytes of the chunk in front of that block, so that a reader can still serve
the whole batches they hold.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import mmap
import uuid
from collections.abc import Callable

from tierproxy.storage.backoff import read_time_left
from tierproxy.storage.errors import CorruptRangeRead, CorruptRemoteSegment, RemoteStorageError
from tierproxy.storage.model import RemoteLogSegmentMetadata
from tierproxy.storage.rsm import RemoteStorageManager

from . import NO_METRICS, CacheMetrics
from .chunk_buffers import ChunkBuffers, ChunkLeases, current_leases
from .single_flight import SingleFlight

ChunkKey = tuple[uuid.UUID, int]

ROOM_RECHECK_S = 0.02
"""A demand load waiting for room that responses hold looks again this often, besides when
a response gives a chunk back."""


class CorruptChunk(CorruptRemoteSegment):
    """A chunk's load stopped at a corrupt block. `intact` is the chunk's bytes before that
    block, all checked (possibly empty); `error` is the store's own error about the block."""

    def __init__(self, index: int, intact: bytes, error: CorruptRemoteSegment) -> None:
        super().__init__(f"chunk {index}: {error}")
        self.index = index
        self.intact = intact
        self.error = error


class ChunkCacheFull(RemoteStorageError):
    """The chunk cache's bound is taken by chunks that responses still hold: the read may
    succeed once those are written."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=True)


class ResponseCutShort(ChunkCacheFull):
    """The chunk cache's bound is taken by chunks that responses hold, and the response this
    load is for holds some of them: rather than wait for room it may itself be holding, the
    read ends where it is, and the response is made of what it holds."""


class _NotReached(Exception):
    """A chunk of a run whose read stopped at a corrupt block in front of it."""


def _resolve(part: asyncio.Future[memoryview], data: memoryview) -> None:
    if not part.done():  # a part is cancelled only when the cache closes
        part.set_result(data)


def _fail(part: asyncio.Future[memoryview], error: BaseException) -> None:
    if not part.done():
        part.set_exception(error)


class _Claim:
    """A reader waiting for a chunk's load: the load leases the buffer for it before the
    reader resumes, so that nothing reuses the buffer in between."""

    __slots__ = ("buffer",)

    def __init__(self) -> None:
        self.buffer: mmap.mmap | None = None


class ChunkCache:
    def __init__(
        self,
        rsm: RemoteStorageManager,
        *,
        chunk_size: int,
        max_bytes: int,
        read_ahead_chunks: int = 2,
        max_prefetch_per_segment: int = 4,
        chunks_per_read: int = 4,
        metrics: CacheMetrics = NO_METRICS,
    ) -> None:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if max_bytes < 0 or read_ahead_chunks < 0 or max_prefetch_per_segment < 0:
            raise ValueError("max_bytes, read_ahead_chunks and max_prefetch_per_segment must be >= 0")
        if chunks_per_read < 1:
            raise ValueError(f"chunks_per_read must be positive, got {chunks_per_read}")
        self.rsm = rsm
        self.chunk_size = chunk_size
        self.max_bytes = max_bytes
        self.read_ahead_chunks = read_ahead_chunks
        self.max_prefetch_per_segment = max_prefetch_per_segment
        self.chunks_per_read = chunks_per_read
        self._metrics = metrics
        self._read: collections.OrderedDict[ChunkKey, memoryview] = collections.OrderedDict()
        self._prefetched: collections.OrderedDict[ChunkKey, memoryview] = collections.OrderedDict()
        # The chunks' memory: as many buffers as the bound holds, mapped by `start`.
        self._buffers = ChunkBuffers(chunk_size, count=max_bytes // chunk_size)
        self._claims: dict[ChunkKey, list[_Claim]] = {}
        # Set when a response gives a chunk back: demand loads waiting for room look again.
        self._released = asyncio.Event()
        self._buffers.on_release = self._released.set
        #: Asked, when responses hold the whole bound, to have a holder whose client does not
        #: keep up give its chunks back; returns the bytes it copied (at least 1 when it gave
        #: any back, 0 when none could). The proxy sets it (paced.give_back_paused).
        self.on_full: Callable[[], int] = lambda: 0
        #: The store's read quota (KIP-956's fetch quota; the proxy sets both): told the
        #: bytes of every read from the store as it starts, runs and read-ahead included,
        #: and asked before read-ahead starts whether its bytes fit (speculation yields).
        self.on_store_read: Callable[[int], None] = lambda nbytes: None
        self.read_ahead_fits: Callable[[int], bool] = lambda nbytes: True
        self._read_bytes = 0
        self._prefetched_bytes = 0
        self._reserved_bytes = 0
        self._prefetching: collections.Counter[uuid.UUID] = collections.Counter()
        self._flight: SingleFlight[ChunkKey, memoryview] = SingleFlight()
        # Reads of runs of chunks: each chunk's own load (in `_flight`) waits for its part.
        self._runs: set[asyncio.Task[None]] = set()
        self._closed = False

    # ------------------------------------------------------------------ sizes

    @property
    def stored_bytes(self) -> int:
        return self._read_bytes + self._prefetched_bytes

    @property
    def reserved_bytes(self) -> int:
        """Bytes set aside for prefetches in flight."""
        return self._reserved_bytes

    @property
    def held_bytes(self) -> int:
        """Evicted chunks that responses still hold."""
        return self._buffers.held_bytes

    @property
    def total_bytes(self) -> int:
        """What counts against `max_bytes`: stored chunks, held ones and reservations."""
        return self.stored_bytes + self._buffers.held_bytes + self._reserved_bytes

    def __len__(self) -> int:
        return len(self._read) + len(self._prefetched)

    def __contains__(self, key: ChunkKey) -> bool:
        return key in self._read or key in self._prefetched

    def chunk_count(self, segment: RemoteLogSegmentMetadata) -> int:
        return -(-segment.segment_size_in_bytes // self.chunk_size)

    def chunk_length(self, segment: RemoteLogSegmentMetadata, index: int) -> int:
        start = index * self.chunk_size
        return min(self.chunk_size, segment.segment_size_in_bytes - start)

    # ------------------------------------------------------------------ reads

    async def start(self) -> None:
        """Map the pool's buffers, off the event loop: no read faults fresh memory on it."""
        await asyncio.to_thread(self._buffers.fill)

    async def get(self, segment: RemoteLogSegmentMetadata, index: int, *, read_ahead: bool = True,
                  leases: ChunkLeases | None = None) -> memoryview:
        """Chunk `index` of the segment, leased to `leases` (by default the response being
        made in this context: `chunk_buffers.current_leases`); with `read_ahead`, the next
        chunks are prefetched. A caller holding no leases must not keep the chunk across
        an await."""
        if self._closed:
            raise RuntimeError("chunk cache is closed")
        if not 0 <= index < self.chunk_count(segment):
            raise ValueError(
                f"chunk {index} is outside segment {segment.segment_id.id} of {segment.segment_size_in_bytes} bytes"
            )
        if leases is None:
            leases = current_leases()
        key = (segment.segment_id.id, index)
        data = self._take_leased(key, leases)  # before the read-ahead evicts anything
        if read_ahead:
            # Before waiting on a miss: the next chunks load alongside this one.
            self.prefetch(segment, index + 1, self.read_ahead_chunks)
        if data is not None:
            self._metrics.hit()
            return data
        self._metrics.miss()
        # A response that holds chunks already is not kept waiting for room (ResponseCutShort).
        waits = leases is None or not leases.response or not len(leases)
        while True:
            try:
                data = await self._claim(segment, index, leases, waits)
                self._take(key)  # it may have arrived as a prefetch another reader started: now it is read
                return data
            except ResponseCutShort:
                if not waits:
                    raise
            # The load this reader joined was for a response that holds chunks, and gave up;
            # this one holds none: it loads the chunk itself, waiting for room, unless another
            # reader has meanwhile.
            data = self._take_leased(key, leases)
            if data is not None:
                return data

    async def _claim(self, segment: RemoteLogSegmentMetadata, index: int, leases: ChunkLeases | None,
                     waits: bool) -> memoryview:
        """Chunk `index` as its load (this reader's, or one in flight that it joins) ends,
        leased to `leases` before any other reader resumes."""
        key = (segment.segment_id.id, index)
        claim = _Claim()
        self._claims.setdefault(key, []).append(claim)
        try:
            return await self._flight.run(key, lambda: self._load(segment, index, reserved=0, waits=waits))
        finally:
            claims = self._claims.get(key)
            if claims is not None and claim in claims:
                claims.remove(claim)
                if not claims:
                    del self._claims[key]
            if claim.buffer is not None:  # the claim's lease passes to the holder
                if leases is not None:
                    leases.hold(self._buffers, claim.buffer)
                self._buffers.release(claim.buffer, response=False)

    def invalidate(self, segment_id: uuid.UUID) -> None:
        """Drop a segment's chunks (its bytes failed a check, or it was deleted)."""
        for area in (self._read, self._prefetched):
            for key in [k for k in area if k[0] == segment_id]:
                self._drop(area, key)
        self._publish_size()

    async def close(self) -> None:
        self._closed = True
        for run in self._runs:
            run.cancel()
        await asyncio.gather(*self._runs, return_exceptions=True)
        await self._flight.close()
        self._buffers.clear()

    # ------------------------------------------------------------------ internals

    def _take_leased(self, key: ChunkKey, leases: ChunkLeases | None) -> memoryview | None:
        """A cached chunk, marked most recently read and leased to `leases`."""
        data = self._take(key)
        if data is not None and leases is not None:
            leases.hold(self._buffers, data.obj)  # type: ignore[arg-type]  # a chunk's view is over its mmap buffer
        return data

    def _take(self, key: ChunkKey) -> memoryview | None:
        """A cached chunk, marked most recently read."""
        data = self._read.get(key)
        if data is not None:
            self._read.move_to_end(key)
            return data
        data = self._prefetched.pop(key, None)
        if data is not None:
            self._prefetched_bytes -= len(data)
            self._read[key] = data
            self._read_bytes += len(data)
        return data

    def prefetch(self, segment: RemoteLogSegmentMetadata, first: int, count: int) -> None:
        """Load chunks `first` .. `first + count - 1` in the background, within the bounds
        (a reader's read-ahead reaching into the segment that follows its own). Where the
        store reads runs, a run begun in that window is read whole, `chunks_per_read`
        chunks long, even past it: a window that moves a chunk at a time then still reads
        runs, not single chunks."""
        segment_id = segment.segment_id.id
        per_read = self.chunks_per_read if self.rsm.reads_runs else 1
        end = self.chunk_count(segment) - 1
        last = min(first + count - 1, end)
        run: list[int] = []  # consecutive chunks reserved, not started yet
        i = first
        while i <= last or (run and len(run) < per_read and i <= end):
            key = (segment_id, i)
            i += 1
            if key in self or self._flight.in_flight(key):
                self._start_run(segment, run)
                run = []
                continue
            if not run and self._prefetching[segment_id] >= self.max_prefetch_per_segment:
                break
            size = self.chunk_length(segment, key[1])
            if not self.read_ahead_fits(sum(self.chunk_length(segment, j) for j in run) + size):
                break  # over the read quota: read-ahead yields
            if not self._reserve(size):
                break  # no room without dropping demand: read-ahead yields
            run.append(key[1])
            if len(run) == per_read:
                self._start_run(segment, run)
                run = []
        self._start_run(segment, run)

    def _start_run(self, segment: RemoteLogSegmentMetadata, run: list[int]) -> None:
        """Start the loads of reserved chunks `run`: one read, one of the segment's
        `max_prefetch_per_segment`, for all of them."""
        if not run:
            return
        segment_id = segment.segment_id.id
        self._prefetching[segment_id] += 1
        self.on_store_read(sum(self.chunk_length(segment, i) for i in run))
        parts: dict[int, asyncio.Future[memoryview]] = {}
        if len(run) > 1:
            loop = asyncio.get_running_loop()
            parts = {i: loop.create_future() for i in run}
            task = loop.create_task(self._load_run(segment, run, parts))
            self._runs.add(task)
            task.add_done_callback(self._runs.discard)
        loading = [len(run)]

        def loaded(_task: object) -> None:
            loading[0] -= 1
            if not loading[0]:
                self._prefetch_done(segment_id)

        for i in run:
            size = self.chunk_length(segment, i)
            load = functools.partial(self._run_part, parts[i], segment, i, size) if parts \
                else functools.partial(self._load, segment, i, reserved=size)
            self._flight.start((segment_id, i), load).add_done_callback(loaded)
            self._metrics.prefetched()

    def _prefetch_done(self, segment_id: uuid.UUID) -> None:
        self._prefetching[segment_id] -= 1
        if self._prefetching[segment_id] <= 0:
            del self._prefetching[segment_id]

    def _reserve(self, size: int) -> bool:
        """Set `size` bytes aside for a prefetch, evicting read chunks only."""
        if self._prefetched_bytes + self._reserved_bytes + size > self.max_bytes:
            return False
        if not self._make_room(size, (self._read,)):
            return False
        self._reserved_bytes += size
        self._publish_size()
        return True

    def _held_by_responses(self) -> int:
        """Bytes of chunks, cached or not, that responses hold."""
        held = self._buffers.held_by_response
        cached = sum(len(data) for area in (self._read, self._prefetched) for data in area.values()
                     if held(data.obj))
        return cached + self._buffers.held_bytes

    async def _room_for(self, segment: RemoteLogSegmentMetadata, index: int, size: int, waits: bool) -> None:
        """Until what responses hold leaves room for `size` bytes (or nothing is held): as
        long as the read's deadline allows, then ChunkCacheFull; without `waits`, not at all
        (ResponseCutShort)."""
        while True:
            held = self._held_by_responses()
            if not held or held + size <= self.max_bytes:
                return
            if self.on_full():
                continue  # leases given back: look again
            if not waits:
                raise ResponseCutShort(
                    f"chunk {index} of segment {segment.segment_id.id}: responses hold {held} bytes of the "
                    f"chunk cache's {self.max_bytes}, this read's own response among them")
            left = read_time_left()
            if left is not None and left > 0:
                self._released.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    # Not only until a lease comes back: a holder whose socket fills meanwhile
                    # can be asked to give its chunks back (on_full).
                    await asyncio.wait_for(self._released.wait(), min(left, ROOM_RECHECK_S))
                continue
            raise ChunkCacheFull(
                f"chunk {index} of segment {segment.segment_id.id}: responses not yet written hold "
                f"{held} bytes of the chunk cache's {self.max_bytes} (remote.log.chunk.cache.size.bytes)")

    async def _load(self, segment: RemoteLogSegmentMetadata, index: int, *, reserved: int,
                    waits: bool = True) -> memoryview:
        start = index * self.chunk_size
        size = self.chunk_length(segment, index)
        if not reserved:
            await self._room_for(segment, index, size, waits)
        buffer: mmap.mmap | None = None
        data = memoryview(b"")
        try:
            buffer = await self._buffer()
            data = memoryview(buffer)[:size]
            if not reserved:  # a prefetch's bytes were told when it started
                self.on_store_read(size)
            await self.rsm.read_log_into(segment, start, data)
        except BaseException as e:
            error = self._failed(index, buffer, data, e)
            if error is e:
                raise
            raise error  # noqa: B904 - its cause is set: the store's error about the block
        finally:
            self._reserved_bytes -= reserved
        return self._loaded(segment, index, buffer, data, prefetched=reserved > 0)

    async def _run_part(self, part: asyncio.Future[memoryview], segment: RemoteLogSegmentMetadata,
                        index: int, reserved: int) -> memoryview:
        """Chunk `index`'s load within a run: its part of the run's read, or, where the read
        stopped at a corrupt block in front of it, a read of its own (on its reservation)."""
        try:
            return await part
        except _NotReached:
            self.on_store_read(reserved)  # read again, alone
            return await self._load(segment, index, reserved=reserved)

    async def _load_run(self, segment: RemoteLogSegmentMetadata, run: list[int],
                        parts: dict[int, asyncio.Future[memoryview]]) -> None:
        """Reserved chunks `run` (consecutive) with one read, each cached and its part
        resolved as soon as its bytes are in."""
        sizes = [self.chunk_length(segment, i) for i in run]
        buffers: list[mmap.mmap] = []
        views: list[memoryview] = []
        done = 0
        try:
            for size in sizes:
                buffers.append(await self._buffer())
                views.append(memoryview(buffers[-1])[:size])
            async with contextlib.aclosing(
                    self.rsm.read_log_run(segment, run[0] * self.chunk_size, views)) as filled:
                async for _ in filled:
                    self._reserved_bytes -= sizes[done]
                    data = self._loaded(segment, run[done], buffers[done], views[done], prefetched=True)
                    _resolve(parts[run[done]], data)
                    done += 1
        except BaseException as e:
            cancelled = isinstance(e, asyncio.CancelledError)
            if done == len(run):  # every chunk is in: what failed after them concerns none
                if cancelled:
                    raise
                return
            rest = run[done:]
            error = self._failed(run[done], buffers[done] if done < len(buffers) else None,
                                 views[done] if done < len(views) else memoryview(b""), e)
            for buffer in buffers[done + 1:]:
                self._buffers.retire(buffer, 0)
            # After a corrupt block the chunks that follow it may well be intact: they load
            # alone, on their reservations. Any other failure is theirs too.
            corrupt = isinstance(error, CorruptChunk)
            for i, size in zip(rest, sizes[done:]):
                if cancelled:
                    self._reserved_bytes -= size
                    parts[i].cancel()
                elif corrupt and i != rest[0]:
                    _fail(parts[i], _NotReached())
                else:
                    self._reserved_bytes -= size
                    _fail(parts[i], error)
            if cancelled:
                raise

    async def _buffer(self) -> mmap.mmap:
        """A free buffer of the pool; none free, one mapped off the event loop."""
        buffer = self._buffers.take()
        return buffer if buffer is not None else await asyncio.to_thread(self._buffers.map_one)

    def _failed(self, index: int, buffer: mmap.mmap | None, data: memoryview, error: BaseException) -> BaseException:
        """The error of chunk `index`'s failed load, its buffer given back: CorruptChunk with
        what the store checked before a corrupt block (the caller may use it; the cache
        keeps nothing of this chunk), else the store's own."""
        intact = bytes(data[:error.filled]) if isinstance(error, CorruptRangeRead) else b""
        if buffer is not None:
            self._buffers.retire(buffer, 0)
        if isinstance(error, CorruptRangeRead):
            corrupt = CorruptChunk(index, intact, error.error)
            corrupt.__cause__ = error.error  # as `raise ... from error.error` sets it
            return corrupt
        return error

    def _loaded(self, segment: RemoteLogSegmentMetadata, index: int, buffer: mmap.mmap,
                data: memoryview, *, prefetched: bool) -> memoryview:
        """Chunk `index` read into `buffer`: leased to the readers waiting for it, cached."""
        self._metrics.loaded(segment.topic_id_partition.topic, len(data))
        key = (segment.segment_id.id, index)
        for claim in self._claims.pop(key, ()):  # leased before any reader resumes
            self._buffers.acquire(buffer, response=False)
            claim.buffer = buffer
        if self._closed:
            self._buffers.retire(buffer, len(data))
        else:
            self._insert(key, data, prefetched=prefetched)
        return data

    def _insert(self, key: ChunkKey, data: memoryview, *, prefetched: bool) -> None:
        size = len(data)
        for area in (self._read, self._prefetched):
            if key in area:
                self._drop(area, key)
        if prefetched:
            # Its reservation was just released: the room is there, read chunks aside.
            self._make_room(size, (self._read,))
        elif self._reserved_bytes + size <= self.max_bytes:
            self._make_room(size, (self._prefetched, self._read))
        if self.total_bytes + size > self.max_bytes:
            # No room beside the prefetches in flight and the chunks responses hold:
            # served, not kept.
            self._publish_size()
            self._buffers.retire(data.obj, size)  # type: ignore[arg-type]  # a view of a pool mmap
            return
        if prefetched:
            self._prefetched[key] = data
            self._prefetched_bytes += size
        else:
            self._read[key] = data
            self._read_bytes += size
        self._publish_size()

    def _make_room(self, size: int, areas: tuple[collections.OrderedDict[ChunkKey, memoryview], ...]) -> bool:
        """Evict the oldest chunks of `areas`, in that order, that no response holds (evicting
        a held one frees nothing) until `size` more bytes fit; whether they do."""
        leased = self._buffers.leased
        for area in areas:
            for key in [key for key, data in area.items() if not leased(data.obj)]:
                if self.total_bytes + size <= self.max_bytes:
                    return True
                self._drop(area, key)
                self._metrics.evicted()
        return self.total_bytes + size <= self.max_bytes

    def _drop(self, area: collections.OrderedDict[ChunkKey, memoryview], key: ChunkKey) -> None:
        data = area.pop(key)
        if area is self._read:
            self._read_bytes -= len(data)
        else:
            self._prefetched_bytes -= len(data)
        self._buffers.retire(data.obj, len(data))  # type: ignore[arg-type]  # a view of a pool mmap

    def _publish_size(self) -> None:
        self._metrics.size(self.total_bytes, len(self))
