"""proxy.fetch_turns: turns at the remote fetch quota. A turn goes when the quota has room
for what it may read; connections held back go in the order they were first held back,
whoever asks more often; what a turn may read is set aside until its reads are done."""

from __future__ import annotations

import asyncio

from tierproxy.proxy.fetch_turns import FetchTurns
from tierproxy.storage.quota import QuotaSettings, RateQuota
from tierproxy.storage.shared_quota import SharedQuotaFile, SharedSampledRate, create

QUOTA = 10_000  # bytes per second, over 2 samples of 1 s


async def test_connections_held_back_read_in_turn_whoever_asks_more_often():
    quota = RateQuota(QuotaSettings(QUOTA, 2, 1))
    turns = FetchTurns(quota)
    quota.record(25_000)  # 2.5 s worth: nobody reads until that sample is dropped
    order: list[str] = []

    async def waits(name: str) -> None:
        while not await turns.turn(name, 1000, 0.5):  # a consumer's Fetch after Fetch
            await asyncio.sleep(0.01)
        order.append(name)
        quota.record(5_000)

    async def keeps_asking(name: str) -> None:
        while not turns.try_turn(name, 1000):  # Fetches that do not wait
            await asyncio.sleep(0.005)
        order.append(name)
        quota.record(5_000)

    first = [asyncio.create_task(waits(name)) for name in ("a", "b", "c")]
    await asyncio.sleep(0.05)
    late = asyncio.create_task(keeps_asking("d"))
    await asyncio.wait_for(asyncio.gather(*first, late), 10)
    assert order == ["a", "b", "c", "d"]
    assert turns.waiting() == 0


async def test_a_turn_goes_when_the_quota_has_room_for_what_it_may_read():
    quota = RateQuota(QuotaSettings(QUOTA, 2, 1))
    turns = FetchTurns(quota)
    quota.record(8_000)
    assert turns.try_turn("a", 2_000)
    with turns.reading(2_000):  # set aside while its reads run
        assert not turns.try_turn("b", 1)
        assert not quota.allows(1)
    assert quota.allows(2_000) and not quota.allows(2_001)
    assert turns.try_turn("b", 2_000)


def test_what_a_turn_may_read_is_whole_chunks_within_a_tenth_of_the_quota_window():
    quota = 1_000_000
    turns = FetchTurns(RateQuota(QuotaSettings(quota, 2, 1)))
    assert turns.turn_bytes([1000, 1500], budget=100_000, chunk_size=1024) == 1024 + 2048
    assert turns.turn_bytes([1000, 1500], budget=1200, chunk_size=1024) == 2048  # the budget in chunks
    # Room for at most a tenth of the quota's window (2 s) is asked,
    assert turns.turn_bytes([1 << 20], budget=50 << 20, chunk_size=4 << 20) == quota * 2 // 10
    # and at most one sample's worth: all the room there is after an idle spell.
    turns = FetchTurns(RateQuota(QuotaSettings(quota, 11, 1)))
    assert turns.turn_bytes([1 << 20], budget=50 << 20, chunk_size=4 << 20) == quota
    assert turns.try_turn("after an idle spell", quota)


async def test_connections_of_different_workers_read_in_the_order_they_were_held_back(tmp_path):
    """Workers share the quota and the line (storage/shared_quota.py): the connection held
    back first, in whichever worker, reads first."""
    path = str(tmp_path / "fetch-quota")
    create(path, 2, 2)
    workers = []
    for index in (0, 1):
        shared = SharedQuotaFile(path, index)
        quota = RateQuota(QuotaSettings(QUOTA, 2, 1), rate=SharedSampledRate(shared, 1))
        workers.append(FetchTurns(quota, shared=shared))
    workers[1].quota.record(25_000)  # 2.5 s worth, recorded by the other worker
    assert not workers[0].try_turn("first", 1000)
    order: list[str] = []

    async def waits(name: str, turns: FetchTurns) -> None:
        while not await turns.turn(name, 1000, 0.5):
            await asyncio.sleep(0.01)
        order.append(name)
        turns.quota.record(5_000)

    waiting = []
    for name, worker in (("a", 0), ("b", 1), ("c", 0), ("d", 1)):
        waiting.append(asyncio.create_task(waits(name, workers[worker])))
        await asyncio.sleep(0.02)
    await asyncio.wait_for(asyncio.gather(*waiting), 15)
    assert order == ["a", "b", "c", "d"]
    assert all(turns.waiting() == 0 for turns in workers)
