"""Kafka's remote log reader thread pool, as asyncio tasks.

`threads` reads run at once (`remote.log.reader.threads`); at most
`max_pending_tasks` wait for a reader (`remote.log.reader.max.pending.tasks`).
Past that, `submit` refuses at once with ReaderQueueFull: the partition gets an
error now, never a place in an unbounded queue. As Kafka's `RemoteLogReader`, a
task never raises to its submitter: its future resolves to a ReadOutcome holding
the value or the error.

`remote.fetch.max.wait.ms` is applied by `read(..., timeout=...)`. When it runs
out, the caller gets `ReadOutcome(expired=True)` (Kafka answers empty records, no
error) and the task is cancelled the way Kafka's `DelayedRemoteFetch` does it
(`cancel(false)`): a read still waiting for a reader never starts; a read already
running is not interrupted. It completes in the background and warms the caches,
and since it keeps its reader until then, such reads are bounded by `threads`
like any other; its result is dropped. A caller that is itself cancelled (its client
connection closed: nobody will read the answer) takes its read with it, waiting or
running: a running one stops at its next wait, a chunk or index load in flight, which
goes on for the caches and for any other reader of it, and its reader goes to the next
read at once, not after the rest of a read of up to `remote.fetch.max.bytes`. Nothing
is left half done: no cache ever holds a partial chunk or index, whatever is cancelled
when.

Waiting reads take turns by owner (`read_owner`: the client connection a read is for),
not first come first served: fifty connections that pipeline Fetches get one turn each, as
one honest consumer does, not fifty times their partitions. Turns are weighed by the bytes
a read may return (its `cost`), as start-time fair queuing does: each read is tagged when
it is submitted with its owner's bytes so far, counted from the tag of the read started
last, and the waiting read with the lowest tag starts next. So a connection reading one
partition of 4 MiB per Fetch gets a read of 1 MiB for each of a consumer's four partitions
of 1 MiB in between, not four times the consumer's bytes; with equal costs this is round
robin. An owner whose responses are not being read (`ReadOwner.stalled`) waits behind every
other owner. When the queue is full, the owner ranked last, of those the one with the most
bytes waiting, gives up its newest read to a submitter ranked before it, or ranked alike
with fewer bytes waiting (ReaderQueueFull for that read), so the bound holds without
refusing the connections that queue little. The ranks: stalled last, then one that sent
another Fetch before this one was answered (`ReadOwner.pipelining`: no consumer does,
Kafka's clients keep one Fetch in flight per broker), then the rest. A pipelining owner
still takes its turns: once answered, it stalls or reads like any other; held back, its
reads would only expire, and their empty answers bring its next Fetch at once.

Chunks are loaded ahead of a read (beyond what it reads itself) only for an owner that reads
a partition sequentially (`owner_reads_on`): its read starts where its last read of that
partition ended, or where that one started (the same fetch again). A connection that fetches
at offsets of its own choosing (a first fetch, a seek, or a client that reads at random
places and resets) would only fill the chunk cache with chunks nobody reads, in the place
of those that sequential readers are about to read.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from tierproxy.storage.backoff import read_deadline
from .failures import Cause, ReaderQueueFull
from .metrics import RemoteMetrics

log = logging.getLogger(__name__)

__all__ = ("ReadOwner", "ReaderQueueFull", "ReadOutcome", "RemoteLogReaderPool", "owner_read", "owner_reads_ahead",
           "owner_reads_on", "read_owner")

T = TypeVar("T")

# While reads run or wait, the busy and queue seconds are brought up to date this often,
# so that a scrape in the middle of a long read sees its time so far.
ACCOUNT_INTERVAL_S = 1.0
# Owners' finish tags kept before the first pruning.
_FORGET_ABOVE = 256


class ReadOwner(Protocol):
    """Whom a read is for: the pool gives owners turns in rotation."""

    @property
    def stalled(self) -> bool:
        """Its responses are not being read: its reads wait behind every other owner's."""
        ...

    @property
    def pipelining(self) -> bool:
        """It sent another Fetch before the one being read for was answered: a full queue
        refuses its reads before those of an owner that neither stalls nor pipelines."""
        ...


_OWNER: contextvars.ContextVar[ReadOwner | None] = contextvars.ContextVar("tierproxy_read_owner", default=None)


def read_owner(owner: ReadOwner | None) -> contextvars.Token[ReadOwner | None]:
    """Make `owner` the owner of every read submitted in this context from now on."""
    return _OWNER.set(owner)


def owner_reads_ahead() -> bool:
    """Whether the read running in this context may load chunks ahead: not for a stalled
    owner, whose chunks loaded ahead would only take the chunk cache's room from readers
    that read."""
    return not _stalled(_OWNER.get())


# Per owner, per partition: the offsets its last read of it started at and ended before.
_LAST_READ: weakref.WeakKeyDictionary[ReadOwner, dict[Hashable, tuple[int, int]]] = weakref.WeakKeyDictionary()


def owner_reads_on(partition: Hashable, offset: int) -> bool:
    """Whether the read of `partition` from `offset` running in this context continues the
    owner's last read of it (starts where that ended, or where it started), so that chunks
    beyond it are worth loading ahead; always, for a read that is no client's."""
    owner = _OWNER.get()
    if owner is None:
        return True
    last = _LAST_READ.get(owner, {}).get(partition)
    return last is not None and last[0] <= offset <= last[1]


def owner_read(partition: Hashable, offset: int, next_offset: int) -> None:
    """The read running in this context read `partition` from `offset` up to `next_offset`."""
    owner = _OWNER.get()
    if owner is not None:
        _LAST_READ.setdefault(owner, {})[partition] = (offset, next_offset)


def _stalled(owner: ReadOwner | None) -> bool:
    return owner is not None and owner.stalled


def _rank(owner: ReadOwner | None) -> int:
    """Whose reads a full queue refuses first: 2 (stalled), then 1 (pipelining), then 0."""
    if _stalled(owner):
        return 2
    return 1 if owner is not None and owner.pipelining else 0


@dataclass(eq=False, slots=True)
class _Entry:
    """A waiting read."""

    read: Callable[[], Awaitable[object]]
    future: asyncio.Future[ReadOutcome]
    context: contextvars.Context
    cost: int
    tag: float  # its start tag: the lowest starts next


@dataclass(frozen=True, slots=True)
class ReadOutcome(Generic[T]):
    """What a remote read task ended with: a value, an error, or expiry of the wait."""

    value: T | None = None
    error: BaseException | None = None
    #: The wait ran out before the read finished: answer empty records, no error.
    expired: bool = False


class RemoteLogReaderPool:
    def __init__(self, *, threads: int, max_pending_tasks: int, metrics: RemoteMetrics | None = None) -> None:
        if threads < 1 or max_pending_tasks < 1:
            raise ValueError(f"threads ({threads}) and max_pending_tasks ({max_pending_tasks}) must be >= 1")
        self.threads = threads
        self.max_pending_tasks = max_pending_tasks
        self.metrics = metrics if metrics is not None else RemoteMetrics()
        self._running = 0
        # Waiting reads by owner, each owner's in the order submitted.
        self._pending: dict[ReadOwner | None, collections.deque[_Entry]] = {}
        # Start-time fair queuing: the tag of the read started last, and each owner's tag
        # after its reads so far (its last read's tag plus its cost).
        self._virtual_time = 0.0
        self._finish: dict[ReadOwner | None, float] = {}
        # `_finish` is pruned when it outgrows this: twice what the last pruning kept, so
        # that each owner seen costs O(1), however many connections come and go.
        self._forget_above = _FORGET_ABOVE
        self._waiting = 0
        # The running reads' tasks, by the future their caller waits on.
        self._tasks: dict[asyncio.Future[ReadOutcome], asyncio.Task[None]] = {}
        self._closed = False
        self.metrics.reader_queue_size.set_function(lambda: self._waiting)
        self.metrics.reader_avg_idle.set_function(self.idle_ratio)
        self.metrics.reader_threads.set(threads)
        # The busy and queue seconds are added up to here.
        self._accounted = time.monotonic()
        self._ticker: asyncio.TimerHandle | None = None

    @property
    def queue_size(self) -> int:
        """Reads waiting for a reader (RemoteLogReaderTaskQueueSize)."""
        return self._waiting

    @property
    def active(self) -> int:
        """Reads running now, background completions of expired reads included."""
        return self._running

    def idle_ratio(self) -> float:
        """Share of readers idle now (RemoteLogReaderAvgIdlePercent: 1 - active / threads)."""
        return 1.0 - self._running / self.threads

    def submit(self, read: Callable[[], Awaitable[T]], cost: int = 1) -> asyncio.Future[ReadOutcome[T]]:
        """Run `read()` on a reader now or when one frees up; raises ReaderQueueFull when full.
        `cost` weighs its owner's turns: the bytes it may return.

        The future resolves to a ReadOutcome, never to an exception. Cancelling it
        before the read started means the read never starts.
        """
        if self._closed:
            raise RuntimeError("remote log reader pool is closed")
        future: asyncio.Future[ReadOutcome[T]] = asyncio.get_running_loop().create_future()
        # The read runs in the submitter's context, whenever it starts: what it reads is
        # leased to the submitter's response (cache.chunk_buffers.current_leases).
        context = contextvars.copy_context()
        owner = _OWNER.get()
        if self._running < self.threads:
            self._virtual_time = self._tag(owner, cost)
            self._launch(read, future, context)
            return future
        if self._waiting >= self.max_pending_tasks and not self._push_out(owner):
            raise ReaderQueueFull(
                f"{self.threads} remote log readers busy and {self.max_pending_tasks} reads waiting"
            )
        self._account()
        entry = _Entry(read, future, context, cost, self._tag(owner, cost))
        self._pending.setdefault(owner, collections.deque()).append(entry)
        self._waiting += 1
        future.add_done_callback(lambda _f: self._unqueue(owner, entry))
        return future

    def _tag(self, owner: ReadOwner | None, cost: int) -> float:
        """The start tag of `owner`'s next read of `cost`, its bytes counted."""
        tag = max(self._virtual_time, self._finish.get(owner, 0.0))
        self._finish[owner] = tag + max(cost, 1)
        if len(self._finish) > self._forget_above:
            self._forget_served()
        return tag

    def _forget_served(self) -> None:
        """Forget the owners served up to the virtual time with nothing waiting (a new read
        of theirs would start from the virtual time anyway). Those served beyond it stay: an
        owner between two Fetches keeps its place in the turns. They can be many (a closed
        connection's stay until the virtual time passes them, and clients may reset
        connections in a loop), hence the next pruning only at twice as many."""
        self._finish = {o: f for o, f in self._finish.items() if f > self._virtual_time or o in self._pending}
        self._forget_above = max(_FORGET_ABOVE, 2 * len(self._finish))

    def _push_out(self, owner: ReadOwner | None) -> bool:
        """The queue is full: refuse the newest read of the owner ranked last, of those the
        one with the most bytes waiting, if it comes after `owner` (ranked after it, or alike
        with more bytes waiting); whether one was refused."""
        def place(o: ReadOwner | None) -> tuple[int, int]:
            return _rank(o), sum(entry.cost for entry in self._pending.get(o, ()))

        hog = max(self._pending, key=place)
        if hog is owner or place(hog) <= place(owner):
            return False
        entry = self._pending[hog][-1]
        self._remove(hog, entry)
        future = entry.future
        if not future.done():
            future.set_result(ReadOutcome(error=ReaderQueueFull(
                f"{self.threads} remote log readers busy and {self.max_pending_tasks} reads waiting; "
                "this read gave its place to a connection with fewer")))
        return True

    async def read(self, read: Callable[[], Awaitable[T]], *, timeout: float | None, topic: str = "",
                   cost: int = 1) -> ReadOutcome[T]:
        """Submit (with `cost`, see `submit`) and wait at most `timeout` seconds
        (remote.fetch.max.wait.ms); never raises for the read.

        A full queue gives `ReadOutcome(error=ReaderQueueFull)`, a wait that runs out
        `ReadOutcome(expired=True)`; both are counted for `topic`.
        """
        submitted = time.monotonic()

        async def within_the_wait() -> T:
            # Store retries stop in time for this fetch to answer, however long the read queued.
            with read_deadline(None if timeout is None else timeout - (time.monotonic() - submitted)):
                return await read()

        try:
            future = self.submit(within_the_wait, cost)
        except ReaderQueueFull as e:
            self.metrics.read_error(topic, Cause.QUEUE_FULL)
            self._observe("queue_full", submitted)
            return ReadOutcome(error=e)
        # The wait runs out by cancelling the future, not the read: one timer, where
        # wait_for(shield(...)) costs two more futures and a task per read.
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            self._give_up(future)

        timer = asyncio.get_running_loop().call_later(timeout, expire) if timeout is not None else None
        try:
            outcome = await future
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not expired or (task is not None and task.cancelling()):  # the caller itself is cancelled
                self._give_up(future)
                running = self._tasks.get(future)
                if running is not None:  # nobody will read what it reads
                    running.cancel()
                raise
            self.metrics.fetch_expired.labels(topic).inc()
            self._observe("expired", submitted)
            return ReadOutcome(expired=True)
        finally:
            if timer is not None:
                timer.cancel()
        if isinstance(outcome.error, ReaderQueueFull):  # its place went to a connection with fewer
            self.metrics.read_error(topic, Cause.QUEUE_FULL)
            self._observe("queue_full", submitted)
        else:
            self._observe("ok" if outcome.error is None else "error", submitted)
        return outcome

    def _observe(self, outcome: str, submitted: float) -> None:
        self.metrics.read_seconds.labels(outcome).observe(time.monotonic() - submitted)

    async def close(self) -> None:
        """Refuse new reads, drop waiting ones, cancel running ones and wait for them."""
        self._closed = True
        self._account()
        if self._ticker is not None:
            self._ticker.cancel()
        pending, self._pending, self._waiting = self._pending, {}, 0
        for entries in pending.values():
            for entry in entries:
                entry.future.cancel()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ internals

    def _launch(self, read: Callable[[], Awaitable[object]], future: asyncio.Future[ReadOutcome],
                context: contextvars.Context) -> None:
        self._account()
        self._running += 1
        loop = asyncio.get_running_loop()
        if self._ticker is None:
            self._ticker = loop.call_later(ACCOUNT_INTERVAL_S, self._tick)
        task = loop.create_task(self._run(read, future), context=context)
        self._tasks[future] = task
        task.add_done_callback(lambda _t: self._tasks.pop(future, None))

    async def _run(self, read: Callable[[], Awaitable[object]], future: asyncio.Future[ReadOutcome]) -> None:
        try:
            try:
                outcome = ReadOutcome(value=await read())
            except asyncio.CancelledError:
                future.cancel()
                raise
            except Exception as e:  # noqa: BLE001 - the outcome carries it to the submitter
                outcome = ReadOutcome(error=e)
            if not future.done():
                future.set_result(outcome)
            elif outcome.error is not None:
                log.debug("remote read finished after its fetch gave up: %s", outcome.error)
        finally:
            self._account()
            self._running -= 1
            self._start_waiting()

    def _start_waiting(self) -> None:
        while self._pending and self._running < self.threads and not self._closed:
            owner = self._next_owner()
            entries = self._pending[owner]
            self._account()
            entry = entries.popleft()
            self._waiting -= 1
            if not entries:
                del self._pending[owner]
            self._virtual_time = max(self._virtual_time, entry.tag)
            if not entry.future.done():
                self._launch(entry.read, entry.future, entry.context)

    def _next_owner(self) -> ReadOwner | None:
        """The owner whose next read has the lowest tag, of those not stalled; all stalled,
        of all (the first submitted of equal tags)."""
        return min(self._pending, key=lambda o: (_stalled(o), self._pending[o][0].tag))

    def _give_up(self, future: asyncio.Future[ReadOutcome]) -> None:
        """Cancel a read's future and free its place in the queue now, not on a later loop turn."""
        future.cancel()
        for owner, entries in self._pending.items():
            for entry in entries:
                if entry.future is future:
                    self._remove(owner, entry)
                    return

    def _unqueue(self, owner: ReadOwner | None, entry: _Entry) -> None:
        # A waiting read given up by its fetch frees its place in the queue at once.
        entries = self._pending.get(owner)
        if entries is not None and entry in entries:
            self._remove(owner, entry)

    def _remove(self, owner: ReadOwner | None, entry: _Entry) -> None:
        self._account()
        entries = self._pending[owner]
        entries.remove(entry)
        self._waiting -= 1
        if not entries:
            del self._pending[owner]

    def _account(self) -> None:
        """Add the reader- and read-seconds since the last call to the busy and queue
        counters; called before every change of `_running` or `_pending`."""
        now = time.monotonic()
        elapsed, self._accounted = now - self._accounted, now
        if self._running:
            self.metrics.reader_busy_seconds.inc(self._running * elapsed)
        if self._waiting:
            self.metrics.reader_queue_seconds.inc(self._waiting * elapsed)

    def _tick(self) -> None:
        self._account()
        self._ticker = None
        if (self._running or self._pending) and not self._closed:
            self._ticker = asyncio.get_running_loop().call_later(ACCOUNT_INTERVAL_S, self._tick)
