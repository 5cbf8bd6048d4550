"""A Fetch of read replica partitions with nothing to answer waits its max_wait_ms at the
proxy, as a broker parks a fetch at the log end; but not when the remote read ran out of
remote.fetch.max.wait.ms (the partition is not at its end: Kafka's DelayedRemoteFetch answers
that read empty at once), nor when a partition answers an error."""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from types import SimpleNamespace

import pytest

from tierproxy.proxy.filters.fetch import FetchFilter, _Remote
from tierproxy.proxy.filters.tiered_state import PartitionOffsets
from tierproxy.remote_log.reader_pool import ReadOutcome
from tierproxy.storage.model import TopicIdPartition

MAX_WAIT = datetime.timedelta(seconds=3)


def replica_entry(outcome: ReadOutcome | None) -> _Remote:
    tp = TopicIdPartition(uuid.uuid4(), "replica", 0)
    entry = _Remote(None, None, tp, PartitionOffsets(0, 0, 0), replica=True)
    entry.outcome = outcome
    return entry


async def held(entry: _Remote) -> float:
    started = time.monotonic()
    await FetchFilter._hold_at_replica_end(SimpleNamespace(max_wait=MAX_WAIT), started, [entry], available=0)
    return time.monotonic() - started


async def test_at_the_replica_end_a_fetch_waits_its_max_wait():
    assert await held(replica_entry(ReadOutcome())) >= MAX_WAIT.total_seconds() * 0.9


@pytest.mark.parametrize("outcome", [ReadOutcome(expired=True), ReadOutcome(error=OSError("refused"))],
                         ids=["expired", "error"])
async def test_a_read_that_expired_or_failed_is_answered_at_once(outcome):
    assert await asyncio.wait_for(held(replica_entry(outcome)), MAX_WAIT.total_seconds()) < 0.5
