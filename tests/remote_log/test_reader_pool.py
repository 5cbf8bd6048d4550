"""RemoteLogReaderPool: bounded concurrency, bounded queue, outcomes instead of exceptions,
and remote.fetch.max.wait.ms; plus the engine wired from the proxy's configuration."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tierproxy.config import parse
from tierproxy.remote_log.reader_pool import (
    ACCOUNT_INTERVAL_S,
    ReaderQueueFull,
    ReadOutcome,
    RemoteLogReaderPool,
    owner_reads_ahead,
    read_owner,
)
from tierproxy.remote_log.metrics import RemoteMetrics
from tierproxy.remote_log.engine import RemoteReadEngine
from tierproxy.storage.errors import RemoteStorageError
from tests.helpers.remote_log import CountingRSM, Partition, build_partition, local_remote_log, new_tp


class Gate:
    """Reads that block until released, counting how many run at once."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running = 0
        self.peak = 0
        self.started = 0
        self.finished = 0

    async def read(self, value: object = "data") -> object:
        self.started += 1
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await self.release.wait()
            self.finished += 1
            return value
        finally:
            self.running -= 1


async def test_at_most_threads_run_and_the_rest_wait_in_order() -> None:
    pool = RemoteLogReaderPool(threads=3, max_pending_tasks=10)
    gate = Gate()
    futures = [pool.submit(lambda i=i: gate.read(i)) for i in range(8)]
    await asyncio.sleep(0.01)
    assert gate.running == 3 and pool.queue_size == 5 and pool.active == 3
    assert pool.idle_ratio() == 0.0
    gate.release.set()
    outcomes = await asyncio.gather(*futures)
    assert [o.value for o in outcomes] == list(range(8))
    assert gate.peak == 3
    assert pool.queue_size == 0 and pool.idle_ratio() == 1.0
    await pool.close()


async def test_busy_and_queue_seconds_add_up_to_the_average_over_time() -> None:
    """3 readers busy and 2 reads waiting for a while: the counters grow by 3 and 2 times that
    while it lasts (a scrape in the middle sees the time so far), and not at all once idle."""
    metrics = RemoteMetrics()
    pool = RemoteLogReaderPool(threads=3, max_pending_tasks=10, metrics=metrics)
    assert metrics.value("tierproxy_remote_log_reader_threads") == 3
    gate = Gate()
    before = time.monotonic()
    futures = [pool.submit(gate.read) for _ in range(5)]
    await asyncio.sleep(0.01)
    start = time.monotonic()
    await asyncio.sleep(2.5 * ACCOUNT_INTERVAL_S)  # no read starts or ends meanwhile
    held = time.monotonic() - start
    busy = metrics.value("tierproxy_remote_log_reader_busy_seconds_total")
    queued = metrics.value("tierproxy_remote_log_reader_task_queue_seconds_total")
    assert 3 * (held - ACCOUNT_INTERVAL_S) <= busy <= 3 * (time.monotonic() - before)
    assert 2 * (held - ACCOUNT_INTERVAL_S) <= queued <= 2 * (time.monotonic() - before)
    gate.release.set()
    await asyncio.gather(*futures)
    await asyncio.sleep(0.01)
    busy = metrics.value("tierproxy_remote_log_reader_busy_seconds_total")
    queued = metrics.value("tierproxy_remote_log_reader_task_queue_seconds_total")
    await asyncio.sleep(1.5 * ACCOUNT_INTERVAL_S)
    assert metrics.value("tierproxy_remote_log_reader_busy_seconds_total") == busy
    assert metrics.value("tierproxy_remote_log_reader_task_queue_seconds_total") == queued
    await pool.close()


async def test_a_full_queue_is_an_immediate_error_not_a_wait() -> None:
    metrics = RemoteMetrics()
    pool = RemoteLogReaderPool(threads=2, max_pending_tasks=3, metrics=metrics)
    gate = Gate()
    accepted = [pool.submit(gate.read) for _ in range(5)]
    with pytest.raises(ReaderQueueFull) as raised:
        pool.submit(gate.read)
    assert raised.value.retriable
    outcome = await asyncio.wait_for(pool.read(gate.read, timeout=10, topic="orders"), 1)
    assert isinstance(outcome.error, ReaderQueueFull) and outcome.value is None
    assert metrics.value("tierproxy_remote_read_errors_total", {"topic": "orders", "reason": "queue_full"}) == 1
    assert metrics.value("tierproxy_remote_log_reader_task_queue_size") == 3
    assert metrics.value("tierproxy_remote_log_reader_avg_idle_percent") == 0.0
    gate.release.set()
    await asyncio.gather(*accepted)
    assert gate.started == 5
    await pool.close()


class Owner:
    """A connection that reads are for: `stalled` while its client reads nothing,
    `pipelining` while a Fetch it sent waits behind the one in hand."""

    def __init__(self, name: str, stalled: bool = False, pipelining: bool = False) -> None:
        self.name = name
        self.stalled = stalled
        self.pipelining = pipelining


def submit_for(pool: RemoteLogReaderPool, owner: Owner, read, cost: int = 1):  # type: ignore[no-untyped-def]
    """`pool.submit(read, cost)` in a context whose reads are `owner`'s."""
    context = contextvars.copy_context()

    def submit():  # type: ignore[no-untyped-def]
        read_owner(owner)
        return pool.submit(read, cost)

    return context.run(submit)


class Order:
    """Reads that record the order they start in, then wait for one release."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = asyncio.Event()

    def read(self, label: str):  # type: ignore[no-untyped-def]
        async def read() -> str:
            self.started.append(label)
            await self.release.wait()
            return label
        return read


async def run_one_at_a_time(pool: RemoteLogReaderPool, order: Order, futures: list) -> None:  # type: ignore[type-arg]
    """Let the reads finish one by one, each freeing the one reader for the next in turn."""
    deadline = time.monotonic() + 10
    while not all(f.done() for f in futures):
        assert time.monotonic() < deadline, "reads left waiting"
        order.release.set()
        await asyncio.sleep(0)
        order.release.clear()
        await asyncio.sleep(0.001)


async def test_waiting_reads_take_turns_by_owner_not_by_arrival() -> None:
    """Fifty pipelining connections get one turn each, as the one honest consumer does:
    its reads do not wait behind all of theirs."""
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=100)
    order = Order()
    hogs = [Owner(f"hog{i}") for i in range(3)]
    honest = Owner("honest")
    futures = [submit_for(pool, hogs[0], order.read("running"))]
    for hog in hogs:  # each queues four reads (a Fetch of four partitions) before the consumer
        futures += [submit_for(pool, hog, order.read(f"{hog.name}-{p}")) for p in range(4)]
    futures += [submit_for(pool, honest, order.read(f"honest-{p}")) for p in range(4)]
    await run_one_at_a_time(pool, order, futures)
    started = order.started[1:]
    # Round robin over the owners in the order they first queued, hog0's running read its
    # first turn: hog1, hog2, honest, hog0.
    assert started[:8] == ["hog1-0", "hog2-0", "honest-0", "hog0-0", "hog1-1", "hog2-1", "honest-1", "hog0-1"]
    assert sorted(started) == sorted(f"{o.name}-{p}" for o in [*hogs, honest] for p in range(4))
    await pool.close()


async def test_a_stalled_owners_reads_wait_behind_every_other_owners() -> None:
    """A connection whose client does not read its responses gets a reader only when no
    other connection waits for one."""
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=100)
    order = Order()
    stuck, reader = Owner("stuck", stalled=True), Owner("reader")
    futures = [submit_for(pool, reader, order.read("running"))]
    futures += [submit_for(pool, stuck, order.read(f"stuck-{p}")) for p in range(3)]
    futures += [submit_for(pool, reader, order.read(f"reader-{p}")) for p in range(3)]
    await run_one_at_a_time(pool, order, futures)
    assert order.started[1:] == ["reader-0", "reader-1", "reader-2", "stuck-0", "stuck-1", "stuck-2"]
    await pool.close()


async def test_a_full_queue_refuses_the_newest_read_of_the_owner_with_most_waiting() -> None:
    """The bound holds, but the connection that queued most gives up its place, not the
    one arriving with fewer: its read gets ReaderQueueFull as its outcome."""
    metrics = RemoteMetrics()
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=4, metrics=metrics)
    order = Order()
    hog, honest = Owner("hog"), Owner("honest")
    running = submit_for(pool, hog, order.read("running"))
    queued = [submit_for(pool, hog, order.read(f"hog-{p}")) for p in range(4)]
    mine = submit_for(pool, honest, order.read("honest-0"))
    assert pool.queue_size == 4
    pushed_out = await asyncio.wait_for(queued[-1], 1)
    assert isinstance(pushed_out.error, ReaderQueueFull) and pushed_out.error.retriable
    # An owner never pushes out its own reads, nor those of an owner with no more than it.
    with pytest.raises(ReaderQueueFull):
        submit_for(pool, hog, order.read("hog-4"))
    await run_one_at_a_time(pool, order, [running, *queued[:-1], mine])
    assert order.started[1:3] == ["honest-0", "hog-0"]  # the hog's running read was its turn
    await pool.close()


async def test_a_pipelining_owner_takes_its_turns_and_a_stalled_one_waits() -> None:
    """A connection that sent another Fetch before its last was answered reads in its turn
    (held back, its reads would expire and their empty answers bring its next Fetch at
    once); a stalled one waits behind both."""
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=100)
    order = Order()
    stuck, piped, reader = Owner("stuck", stalled=True), Owner("piped", pipelining=True), Owner("reader")
    futures = [submit_for(pool, Owner("other"), order.read("running"))]
    futures += [submit_for(pool, owner, order.read(f"{owner.name}-{p}"))
                for owner in (stuck, piped, reader) for p in range(2)]
    await run_one_at_a_time(pool, order, futures)
    assert order.started[1:] == ["piped-0", "reader-0", "piped-1", "reader-1", "stuck-0", "stuck-1"]
    await pool.close()


async def test_a_full_queue_refuses_a_pipelining_owner_before_a_consumer_with_as_many_bytes() -> None:
    """A consumer's Fetch of four partitions queues as many bytes as a pipelining
    connection's: the pipelining one gives up its place, the consumer's fourth read queues."""
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=4)
    order = Order()
    piped, consumer = Owner("piped", pipelining=True), Owner("consumer")
    running = submit_for(pool, Owner("other"), order.read("running"))
    piped_reads = [submit_for(pool, piped, order.read(f"piped-{i}"), cost=2) for i in range(2)]
    consumer_reads = [submit_for(pool, consumer, order.read(f"consumer-{i}"), cost=1) for i in range(2)]
    consumer_reads += [submit_for(pool, consumer, order.read(f"consumer-{i}"), cost=1) for i in (2, 3)]
    for pushed_out in piped_reads:
        assert isinstance((await asyncio.wait_for(pushed_out, 1)).error, ReaderQueueFull)
    await run_one_at_a_time(pool, order, [running, *consumer_reads])
    assert order.started[1:] == [f"consumer-{i}" for i in range(4)]
    await pool.close()


async def test_a_stalled_submitter_never_pushes_out_the_read_of_one_that_reads() -> None:
    """A full queue: a connection whose client reads nothing is refused, even with fewer bytes
    waiting than a connection that reads its answers."""
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=2)
    order = Order()
    reader, stuck = Owner("reader"), Owner("stuck", stalled=True)
    running = submit_for(pool, reader, order.read("running"))
    queued = [submit_for(pool, reader, order.read(f"reader-{i}")) for i in range(2)]
    with pytest.raises(ReaderQueueFull):
        submit_for(pool, stuck, order.read("stuck-0"))
    await run_one_at_a_time(pool, order, [running, *queued])
    assert order.started[1:] == ["reader-0", "reader-1"]
    await pool.close()


async def test_turns_are_weighed_by_the_bytes_a_read_may_return() -> None:
    """A connection reading one partition of 4 MiB per Fetch against a consumer's four of
    1 MiB: the consumer's reads get four turns for each of the other's, not one, so that
    neither gets more bytes read than the other for its turns."""
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=100)
    order = Order()
    big, small = Owner("big"), Owner("small")
    futures = [submit_for(pool, Owner("other"), order.read("running"))]
    futures += [submit_for(pool, big, order.read(f"big-{i}"), cost=4) for i in range(3)]
    futures += [submit_for(pool, small, order.read(f"small-{i}"), cost=1) for i in range(8)]
    await run_one_at_a_time(pool, order, futures)
    assert order.started[1:7] == ["big-0", "small-0", "small-1", "small-2", "small-3", "big-1"]
    await pool.close()


async def test_a_full_queue_refuses_the_owner_with_the_most_bytes_waiting() -> None:
    """A consumer that queued three reads of 1 MiB has fewer bytes waiting than a connection
    with one of 4 MiB: that one gives up its place, not the consumer's fourth partition."""
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=4)
    order = Order()
    big, small = Owner("big"), Owner("small")
    running = submit_for(pool, big, order.read("running"), cost=4)
    big_read = submit_for(pool, big, order.read("big-0"), cost=4)
    small_reads = [submit_for(pool, small, order.read(f"small-{i}"), cost=1) for i in range(4)]
    pushed_out = await asyncio.wait_for(big_read, 1)
    assert isinstance(pushed_out.error, ReaderQueueFull)
    await run_one_at_a_time(pool, order, [running, *small_reads])
    assert order.started[1:] == [f"small-{i}" for i in range(4)]
    await pool.close()


async def test_a_stalled_owners_reads_read_nothing_ahead() -> None:
    """The reader asks `owner_reads_ahead` whether to prefetch: not for a stalled owner."""
    pool = RemoteLogReaderPool(threads=2, max_pending_tasks=4)

    async def ask() -> bool:
        return owner_reads_ahead()

    answers = [await submit_for(pool, owner, ask) for owner in (Owner("reads"), Owner("stuck", stalled=True))]
    assert [a.value for a in answers] == [True, False]
    assert await pool.submit(ask) == ReadOutcome(value=True)  # no owner: not a client's read
    await pool.close()


async def test_errors_come_back_as_outcomes() -> None:
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=1)

    async def failing() -> None:
        raise RemoteStorageError("store down", retriable=True)

    outcome = await pool.read(failing, timeout=1)
    assert isinstance(outcome.error, RemoteStorageError) and not outcome.expired
    assert (await pool.read(lambda: asyncio.sleep(0, "ok"), timeout=1)) == ReadOutcome(value="ok")
    await pool.close()


async def test_expiry_returns_empty_at_once_and_the_running_read_completes_in_the_background() -> None:
    metrics = RemoteMetrics()
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=5, metrics=metrics)
    gate = Gate()
    running = asyncio.create_task(pool.read(gate.read, timeout=0.05, topic="orders"))
    waiting = asyncio.create_task(pool.read(gate.read, timeout=0.05, topic="orders"))
    assert await running == ReadOutcome(expired=True)
    assert await waiting == ReadOutcome(expired=True)
    assert metrics.value("tierproxy_remote_fetch_expired_total", {"topic": "orders"}) == 2
    # The running read keeps its reader until it ends; the one that never started never will.
    assert gate.running == 1 and pool.active == 1 and pool.queue_size == 0
    gate.release.set()
    for _ in range(100):
        if pool.active == 0:
            break
        await asyncio.sleep(0.005)
    assert gate.finished == 1 and gate.started == 1 and pool.active == 0
    await pool.close()


async def test_a_caller_that_goes_away_frees_its_place_in_the_queue() -> None:
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=1)
    gate = Gate()
    busy = pool.submit(gate.read)
    caller = asyncio.create_task(pool.read(gate.read, timeout=None))
    await asyncio.sleep(0.01)
    assert pool.queue_size == 1
    caller.cancel()
    await asyncio.sleep(0)
    assert pool.queue_size == 0
    pool.submit(gate.read).cancel()  # there is room again
    gate.release.set()
    assert (await busy).value == "data"
    await pool.close()


async def test_a_caller_cancelled_while_reading_is_cancelled_not_expired() -> None:
    """The wait's own timer cancels only the read's future; a cancellation of the caller
    (its client went away) stays a cancellation, not an expired read."""
    metrics = RemoteMetrics()
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=1, metrics=metrics)
    gate = Gate()
    caller = asyncio.create_task(pool.read(gate.read, timeout=10))
    await asyncio.sleep(0.01)
    assert pool.active == 1
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert metrics.value("tierproxy_remote_fetch_expired_total", {"topic": ""}) == 0
    gate.release.set()
    await pool.close()


async def test_a_caller_cancelled_while_reading_takes_its_running_read_with_it() -> None:
    """A client that resets the connection while its read runs: nobody will read what the
    read reads, so it stops, and its reader goes to the next read in turn at once."""
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=2)
    gate, order = Gate(), Order()
    caller = asyncio.create_task(pool.read(gate.read, timeout=10))
    await asyncio.sleep(0.01)
    next_in_turn = pool.submit(order.read("next"))
    assert gate.running == 1 and pool.queue_size == 1
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    for _ in range(100):
        if order.started:
            break
        await asyncio.sleep(0.005)
    assert order.started == ["next"] and gate.running == 0 and gate.finished == 0
    assert pool.active == 1 and pool.queue_size == 0
    order.release.set()
    assert (await asyncio.wait_for(next_in_turn, 1)).value == "next"
    await pool.close()


async def test_close_cancels_running_and_waiting_reads() -> None:
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=2)
    gate = Gate()
    futures = [pool.submit(gate.read) for _ in range(3)]
    await asyncio.sleep(0.01)
    await asyncio.wait_for(pool.close(), 1)
    assert all(f.cancelled() for f in futures)
    assert gate.running == 0 and gate.finished == 0
    with pytest.raises(RuntimeError):
        pool.submit(gate.read)


@contextlib.asynccontextmanager
async def _engine(tmp_path: Path, settings: dict[str, str], metrics: RemoteMetrics
                  ) -> AsyncIterator[tuple[Partition, CountingRSM, RemoteReadEngine]]:
    """A started RemoteReadEngine with these settings over a two-segment partition in the
    local stores, reading through a CountingRSM (whose delay a test may raise)."""
    config = parse({"bootstrap.servers": "127.0.0.1:9092", **settings})
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=2)
        slow = CountingRSM(rsm)
        engine = RemoteReadEngine.from_config(config, slow, rlmm, metrics)
        await engine.start()
        yield partition, slow, engine
        await engine.close()


async def test_engine_from_config_reads_and_expires(tmp_path: Path) -> None:
    metrics = RemoteMetrics()
    async with _engine(tmp_path, {
        "remote.log.chunk.size.bytes": "4096",
        "remote.log.chunk.cache.size.bytes": "65536",
        "remote.log.index.file.cache.total.size.mb": "1",
        "remote.log.index.cache.dir": str(tmp_path / "index-cache"),
        "remote.log.reader.threads": "2",
        "remote.log.reader.max.pending.tasks": "2",
        "remote.fetch.max.wait.ms": "100",
        "remote.log.read.ahead.chunks": "0",  # the second segment is not loaded before it is read
    }, metrics) as (partition, slow, engine):
        assert engine.index_cache.max_bytes == 1 << 20 and engine.chunk_cache.chunk_size == 4096
        assert engine.fetch_max_wait_s == 0.1

        outcome = await engine.read(partition.tp, partition.log_start_offset, 1 << 20, min_one_batch=True)
        assert b"".join(outcome.value.records) == partition.log_of(0)
        assert metrics.value("tierproxy_remote_read_requests_total", {"topic": partition.tp.topic}) == 1
        assert metrics.value("tierproxy_remote_fetch_bytes_total", {"topic": partition.tp.topic}) == len(
            partition.log_of(0))

        slow.delay_s = 0.5  # slower than remote.fetch.max.wait.ms
        second = partition.segments[1].start_offset
        expired = await engine.read(partition.tp, second, 1 << 20, min_one_batch=True)
        assert expired == ReadOutcome(expired=True)


async def test_engine_list_offsets_lookups_run_on_the_pool_within_its_bounds(tmp_path: Path) -> None:
    async with _engine(tmp_path, {
        "remote.log.reader.threads": "1",
        "remote.log.reader.max.pending.tasks": "1",
        "remote.list.offsets.request.timeout.ms": "100",
    }, RemoteMetrics()) as (partition, slow, engine):
        assert engine.list_offsets_timeout_s == 0.1
        tp = partition.tp
        found = await engine.offset_for_timestamp(tp, 0)
        assert found.value.offset == partition.log_start_offset and found.error is None
        assert (await engine.max_timestamp(tp)).value.offset == partition.log_end_offset
        assert (await engine.earliest_remote_offset(tp)).value == (partition.log_start_offset, 0)
        assert (await engine.latest_tiered_offset(tp)).value == (partition.log_end_offset, 0)

        # Every reader busy and the queue full: the lookup is refused at once.
        gate = Gate()
        busy = [engine.pool.submit(gate.read) for _ in range(2)]
        refused = await asyncio.wait_for(engine.offset_for_timestamp(tp, 0), 1)
        assert isinstance(refused.error, ReaderQueueFull)
        # The metadata lookups take no reader.
        assert (await engine.earliest_remote_offset(tp)).value == (partition.log_start_offset, 0)
        gate.release.set()
        await asyncio.gather(*busy)

        # A lookup slower than remote.list.offsets.request.timeout.ms expires.
        engine.index_cache.invalidate(partition.segments[1].segment_id.id)
        slow.delay_s = 0.5
        assert await engine.max_timestamp(tp) == ReadOutcome(expired=True)
        unknown = await engine.latest_tiered_offset(new_tp())
        assert unknown.value is None and unknown.error is None


async def test_owners_that_come_and_go_cost_the_queue_o1_each() -> None:
    """Connections that submit a large read and go away (a client resetting in a loop) leave
    finish tags beyond the virtual time: the pool prunes its owners (a new table each time)
    only when their count doubled, not on every read once there are many (that made each
    read cost as much as all the connections of the last second)."""
    pool = RemoteLogReaderPool(threads=1, max_pending_tasks=10)
    gate = Gate()
    busy = pool.submit(gate.read)
    prunings, table = 0, pool._finish
    for i in range(5000):
        submit_for(pool, Owner(f"reset{i}"), gate.read, cost=4 << 20).cancel()
        await asyncio.sleep(0)  # the cancelled read leaves the queue
        if pool._finish is not table:
            prunings, table = prunings + 1, pool._finish
    assert pool.queue_size == 0
    assert 1 <= prunings <= 8  # at 256, 512, ... 4096 owners
    kept = Owner("kept")
    submit_for(pool, kept, gate.read, cost=1 << 20).cancel()  # served beyond the virtual time: kept
    await asyncio.sleep(0)
    assert kept in pool._finish
    gate.release.set()
    assert (await busy).value == "data"
    await pool.close()
