"""The Fetch filter's planning (`proxy.filters.fetch_plan`), without a broker: byte
budgets, the remote partitions' turns, the second broker request and the merge order."""

from __future__ import annotations

import datetime
import time

from hypothesis import given
from hypothesis import strategies as st
from kio.schema.fetch.v12 import request as fetch
from kio.static.primitive import i8, i32, i64

from tierproxy.protocol.fetch_wire import ScannedPartition
from tierproxy.protocol.requests import milliseconds
from tierproxy.proxy.filters import fetch_plan as plan
from tierproxy.proxy.filters.tiered_state import OFFSETS_MAX_AGE_S, PartitionOffsets

MS = datetime.timedelta(milliseconds=1)

def fetch_request(partitions: dict[str, list[int]]) -> fetch.FetchRequest:
    return fetch.FetchRequest(
        max_wait=milliseconds(500), min_bytes=i32(1), max_bytes=i32(1 << 20), isolation_level=i8(0),
        session_id=i32(0), session_epoch=i32(-1), forgotten_topics_data=(),
        topics=tuple(fetch.FetchTopic(topic=name, partitions=tuple(
            fetch.FetchPartition(partition=i32(p), fetch_offset=i64(0), partition_max_bytes=i32(1024)) for p in indexes))
            for name, indexes in partitions.items()),
    )


sizes = st.lists(st.integers(min_value=0, max_value=1 << 20), min_size=1, max_size=40)


def test_the_remote_budget_is_what_the_broker_left_at_most_the_remote_bound():
    assert plan.remote_budget(1000, 300, 5000) == 700
    assert plan.remote_budget(1000, 300, 500) == 500
    assert plan.remote_budget(1000, 1200, 500) == 0  # the broker's records filled the response


@given(sizes, st.integers(min_value=0, max_value=1 << 30), st.integers(min_value=0, max_value=1 << 22))
def test_a_turn_reads_distinct_partitions_from_the_rotation_while_under_the_budget(limits, rotation, budget):
    chosen, after = plan.remote_turn(limits, rotation, budget)
    assert chosen and len(set(chosen)) == len(chosen)
    assert chosen[0] == rotation % len(limits)
    assert chosen == [(chosen[0] + i) % len(limits) for i in range(len(chosen))]
    planned = [min(limits[i], budget) for i in chosen]
    assert sum(planned[:-1]) < budget or len(chosen) == 1  # each one after the first was still under it
    if len(chosen) < len(limits):
        assert sum(planned) >= budget  # stopped only because the budget was planned
    assert after == chosen[0] + len(chosen)


@given(sizes, st.integers(min_value=0, max_value=1 << 22))
def test_every_remote_partition_gets_its_turn(limits, budget):
    """Partitions left out start the next Fetch: within as many Fetches as there are
    partitions, each is read."""
    rotation, read = 0, set()
    for _ in range(len(limits)):
        chosen, rotation = plan.remote_turn(limits, rotation, budget)
        read.update(chosen)
    assert read == set(range(len(limits)))


def test_the_first_remote_partition_gets_a_whole_batch_when_first_or_starved():
    assert plan.first_gets_whole_batch(0, remote_starved=False)
    assert not plan.first_gets_whole_batch(10, remote_starved=False)
    assert plan.first_gets_whole_batch(10, remote_starved=True)


def test_records_go_in_when_they_fit_or_are_the_one_whole_batch():
    assert plan.takes(100, 100, min_one_batch=False)
    assert not plan.takes(101, 100, min_one_batch=False)
    assert plan.takes(101, 0, min_one_batch=True)
    assert not plan.takes(0, 100, min_one_batch=True)  # nothing read: nothing served
    assert not plan.takes(2048, 1024, min_one_batch=False)  # over partition_max_bytes: only as the one batch


@given(st.integers(min_value=0, max_value=60_000), st.integers(min_value=0, max_value=60_000_000),
       st.integers(min_value=0, max_value=1 << 20), st.integers(min_value=0, max_value=1 << 20))
def test_the_second_request_waits_what_is_left_for_what_is_missing(wait_ms, elapsed_us, min_bytes, remote_bytes):
    max_wait, elapsed = wait_ms * MS, datetime.timedelta(microseconds=elapsed_us)
    second = plan.second_request(max_wait, elapsed, min_bytes, remote_bytes)
    if max_wait - elapsed < MS:
        assert second is None
        return
    assert second is not None
    left, missing = second
    assert left % MS == datetime.timedelta(0) and max_wait - elapsed - MS < left <= max_wait - elapsed
    assert missing == max(min_bytes - remote_bytes, 1)


def test_a_merged_response_takes_the_remote_answer_else_the_brokers_in_the_given_order():
    order = [("b", [2, 0, 1]), ("a", [0]), ("c", [5])]
    remote = {("b", 0): "remote b0"}
    broker = {("b", 2): "broker b2", ("b", 0): "broker b0", ("a", 0): "broker a0"}
    assert plan.assemble(order, remote, broker) == [("b", ["broker b2", "remote b0"]), ("a", ["broker a0"])]


def test_a_fresh_proof_serves_offsets_below_the_local_log_start_it_read():
    fresh = PartitionOffsets(local_log_start=100, high_watermark=150, last_stable_offset=150)
    assert plan.proven_below(fresh, 99)
    assert not plan.proven_below(fresh, 100)  # the broker's own
    assert not plan.proven_below(None, 0)  # never proven on this connection
    stale = PartitionOffsets(100, 150, 150, read_at=time.monotonic() - 2 * OFFSETS_MAX_AGE_S)
    assert not plan.proven_below(stale, 99)  # the broker renews it first


def test_the_brokers_part_leaves_out_the_partitions_served_without_it():
    request = fetch_request({"a": [0, 1], "b": [0]})
    part = plan.broker_part(request, {("a", 1), ("b", 0)}, by_id=False)
    assert [(t.topic, [p.partition for p in t.partitions]) for t in part.topics] == [("a", [0])]
    assert part.max_wait == request.max_wait and part.session_epoch == request.session_epoch
    assert plan.broker_part(request, {("a", 0), ("a", 1), ("b", 0)}, by_id=False) is None


def test_a_merged_response_follows_the_broker_unless_partitions_skipped_it():
    request = fetch_request({"a": [0, 1], "b": [3]})
    assert plan.response_order(request, None) == [("a", [0, 1]), ("b", [3])]
    # An incremental session answer names a partition the request omitted.
    answered = [("b", [ScannedPartition(3, 0, 0, 0, 0)]), ("a", [ScannedPartition(2, 1, 0, 0, 0)])]
    assert plan.response_order(request, answered) == [("b", [3]), ("a", [2])]
