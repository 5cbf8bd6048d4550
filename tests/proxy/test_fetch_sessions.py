"""Fetch sessions (KIP-227) pass through the proxy: the broker keeps the session, the
proxy replaces only the partitions the broker answers OFFSET_OUT_OF_RANGE.

Raw Fetch v12 requests on one connection play the part of a session-using client (the
Java consumer's rules: a full fetch with epoch 0, then incremental fetches naming only
the partitions whose position moved); `test_tiered_fetch` runs the Java consumer itself.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import asynccontextmanager

import pytest

from tierproxy.client.connection import KafkaConnection
from tierproxy.protocol.apis import ApiKey, ErrorCode
from tierproxy.protocol.records import iter_batches
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tests.helpers.fetch_sessions import answered, chain_handled, session_fetch
from tests.helpers.fixtures import proxy_fixture, tiered_fixture
from tests.helpers.produce import produce_timed
from tests.helpers.proxy import ProxyThread
from tests.helpers.acl import fetch_at
from tests.helpers.tiered import TWO_TIMED_PARTITIONS, TieredTopic, tier_and_trim

pytestmark = pytest.mark.timeout(180)

PER_PARTITION = TWO_TIMED_PARTITIONS.produce.per_partition


def data_offsets(records: bytes | None, position: int) -> list[int]:
    """Offsets of the data batches' records at or after `position` (what a client keeps)."""
    return [o for b in iter_batches(records or b"") if not b.is_control
            for o in range(max(b.base_offset, position), b.last_offset + 1)]


def next_position(records: bytes | None, position: int) -> int:
    batches = list(iter_batches(records or b""))
    return batches[-1].next_offset if batches else position


tiered = tiered_fixture(TWO_TIMED_PARTITIONS)  # two partitions, the first 60% of each remote only
proxy = proxy_fixture()


@asynccontextmanager
async def connection(proxy: ProxyThread):
    host, port = proxy.bootstrap_servers.rsplit(":", 1)
    async with await KafkaConnection.open(host, int(port)) as conn:
        yield conn


def ends_of(tiered: TieredTopic) -> dict[int, int]:
    return {p: max(r.offset for r in tiered.records if r.partition == p) + 1 for p in (0, 1)}


async def test_a_session_reads_across_the_boundary_incrementally(proxy, tiered):
    ends = ends_of(tiered)
    positions = {0: 0, 1: 0}
    got: dict[int, list[int]] = {0: [], 1: []}
    async with connection(proxy) as conn:
        # Partition 0 reads in smaller steps, so partition 1 reaches its end first.
        steps = {0: 8 * 1024, 1: 64 * 1024}
        response = await conn.request(session_fetch(tiered.topic, positions, session_id=0, epoch=0,
                                                    partition_max_bytes=steps))
        session_id = response.session_id
        assert response.error_code == 0 and session_id != 0
        epoch, omitted_at_end = 0, 0
        while positions != ends and epoch < 500:
            moved = {}
            for index, partition in answered(response).items():
                assert partition.error_code == 0, (index, partition)
                got[index] += data_offsets(partition.records, positions[index])
                new = next_position(partition.records, positions[index])
                if new != positions[index]:
                    positions[index] = moved[index] = new
            omitted_at_end += any(p not in moved and positions[p] == ends[p] for p in positions)
            epoch += 1
            response = await conn.request(session_fetch(tiered.topic, moved, session_id=session_id, epoch=epoch,
                                                        partition_max_bytes=steps))
            assert response.error_code == 0 and response.session_id == session_id
    assert positions == ends
    for partition in (0, 1):
        expected = [r.offset for r in tiered.records if r.partition == partition]
        assert got[partition] == expected, partition
        assert expected[0] < tiered.boundary[partition] < expected[-1]  # both sides of the boundary were read
    assert omitted_at_end > 0  # incremental requests really left a partition out


async def test_a_partition_the_session_omits_is_read_from_where_it_stopped(proxy, tiered):
    async with connection(proxy) as conn:
        # max_bytes 1: one partition gets its one whole batch (KIP-74), the other nothing.
        first = await conn.request(session_fetch(tiered.topic, {0: 0, 1: 0}, session_id=0, epoch=0, max_bytes=1))
        assert first.error_code == 0 and first.session_id != 0
        parts = answered(first)
        (read,) = [p for p, data in parts.items() if data.records]
        (left,) = [p for p, data in parts.items() if not data.records]
        assert parts[left].error_code == 0
        moved_to = next_position(parts[read].records, 0)
        # The client names only the partition whose position moved.
        second = await conn.request(session_fetch(tiered.topic, {read: moved_to}, session_id=first.session_id,
                                                  epoch=1))
    assert second.error_code == 0 and second.session_id == first.session_id
    parts = answered(second)
    assert set(parts) == {0, 1}
    assert data_offsets(parts[left].records, 0)[0] == 0  # from its kept position, remote
    assert data_offsets(parts[read].records, moved_to)[0] == moved_to


@asynccontextmanager
async def later_topic(kafka_cluster, prefix: str):
    """A topic of two partitions, all local, beside the shared one: (name, its records)."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, partitions=2)
    try:
        records = await asyncio.to_thread(produce_timed, {"bootstrap.servers": kafka_cluster.bootstrap_servers},
                                          topic, 2, PER_PARTITION)
        yield topic, records
    finally:
        kafka_cluster.delete_topic(topic)


async def tier_partition_1(kafka_cluster, tiered: TieredTopic, topic: str, records) -> TieredTopic:
    """Tier partition 1 of `topic` to the proxy's store and trim it on the broker."""
    root = tiered.root
    async with LocalRemoteStorageManager(root / "remote") as rsm, \
            FileRemoteLogMetadataManager(root / "metadata") as rlmm:
        return await tier_and_trim(kafka_cluster.bootstrap_servers, topic, records, rsm=rsm, rlmm=rlmm,
                                   work_dir=root / "work", partitions=[1])


async def test_a_partition_gone_remote_at_a_position_the_proxy_never_saw_restarts_the_session(
        kafka_cluster, proxy, tiered):
    """The broker trims a partition under a session whose client did not move on it: the
    proxy does not know the position, the client is sent to a new session, and the full
    fetch that opens it reads the remote data. (Tiered to the proxy's store, beside the
    shared topic.)"""
    async with later_topic(kafka_cluster, "sessions-later") as (topic, records), connection(proxy) as conn:
        # All local: partition 1 gets nothing within max_bytes, its position stays 0.
        first = await conn.request(session_fetch(topic, {0: 0, 1: 0}, session_id=0, epoch=0, max_bytes=1))
        assert first.error_code == 0 and first.session_id != 0
        parts = answered(first)
        assert parts[0].records and not parts[1].records
        session_id = first.session_id
        later = await tier_partition_1(kafka_cluster, tiered, topic, records)
        restarted = await conn.request(session_fetch(topic, {}, session_id=session_id, epoch=1))
        assert restarted.error_code == ErrorCode.fetch_session_id_not_found
        assert restarted.session_id == 0 and not restarted.responses
        # The new session's full fetch reads partition 1 from 0, from the remote tier
        # (once the proxy's metadata refresh has seen the new segments).
        for _ in range(100):
            full = await conn.request(session_fetch(topic, {1: 0}, session_id=0, epoch=0))
            assert full.error_code == 0
            (partition,) = answered(full).values()
            if partition.records:
                break
            assert partition.error_code in (0, ErrorCode.offset_out_of_range), partition
            await asyncio.sleep(0.1)
        assert full.session_id != 0
        assert partition.error_code == 0 and data_offsets(partition.records, 0)[0] == 0
        assert later.boundary[1] > 0


async def test_session_errors_from_the_broker_pass_through(proxy, tiered):
    async with connection(proxy) as conn:
        unknown = await conn.request(session_fetch(tiered.topic, {0: 0}, session_id=2_000_000_001, epoch=1))
        assert unknown.error_code == ErrorCode.fetch_session_id_not_found
        opened = await conn.request(session_fetch(tiered.topic, {0: 0}, session_id=0, epoch=0))
        assert opened.error_code == 0 and opened.session_id != 0
        wrong_epoch = await conn.request(session_fetch(tiered.topic, {}, session_id=opened.session_id, epoch=5))
        assert wrong_epoch.error_code == ErrorCode.invalid_fetch_session_epoch


async def test_fetches_with_nothing_remote_are_never_decoded(proxy, tiered, monkeypatch):
    import tierproxy.proxy.filters.messages as messages

    decoded = []
    original = messages.decode_request

    def decode_request(api_key, api_version, payload, *, checked=False):
        decoded.append((api_key, checked))
        return original(api_key, api_version, payload, checked=checked)

    monkeypatch.setattr(messages, "decode_request", decode_request)
    local = {p: tiered.boundary[p] for p in (0, 1)}
    async with connection(proxy) as conn:
        opened = await conn.request(session_fetch(tiered.topic, local, session_id=0, epoch=0))
        assert opened.session_id != 0 and all(p.records for p in answered(opened).values())
        sessionless = await conn.request(session_fetch(tiered.topic, local, session_id=0, epoch=-1))
        assert sessionless.session_id == 0 and all(p.records for p in answered(sessionless).values())
        assert decoded == []
        # A remote position is decoded (the proxy must answer it).
        remote = await conn.request(session_fetch(tiered.topic, {0: 0}, session_id=0, epoch=-1))
        assert answered(remote)[0].records
    # Once, and without a second length walk: the session check bounded every length.
    assert decoded == [(ApiKey.FETCH, True)]


@pytest.fixture
def handled(monkeypatch) -> list[int]:
    return chain_handled(monkeypatch)


async def test_a_session_at_the_tail_meets_no_chain_until_a_partition_is_remote(proxy, tiered, handled):
    local = {p: tiered.boundary[p] for p in (0, 1)}
    async with connection(proxy) as conn:
        opened = await conn.request(session_fetch(tiered.topic, local, session_id=0, epoch=0))
        assert opened.error_code == 0 and opened.session_id != 0
        assert all(p.records for p in answered(opened).values())
        # At the log end: the broker answers nothing new, the session goes on.
        ends = ends_of(tiered)
        epoch = 1
        moved = await conn.request(session_fetch(tiered.topic, ends, session_id=opened.session_id, epoch=epoch))
        assert moved.error_code == 0 and moved.session_id == opened.session_id
        assert not any(p.records for p in answered(moved).values())
        assert handled == []
        # The client seeks partition 0 back to 0, in the session: the broker answers it
        # OFFSET_OUT_OF_RANGE, and the chain takes that answer to the remote tier.
        epoch += 1
        sought = await conn.request(session_fetch(tiered.topic, {0: 0}, session_id=opened.session_id, epoch=epoch))
        assert sought.error_code == 0 and sought.session_id == opened.session_id
        (partition,) = answered(sought).values()
        assert partition.error_code == 0 and data_offsets(partition.records, 0)[0] == 0
        assert len(handled) == 1


async def test_a_partition_trimmed_under_its_session_is_read_from_the_remote_tier(kafka_cluster, proxy, tiered,
                                                                                   handled):
    """The broker trims a partition under a session whose client moved on it: the
    incremental fetch names the partition, the broker answers it OFFSET_OUT_OF_RANGE, and
    the proxy serves it from the remote tier in that same session. (Tiered to the proxy's
    store, beside the shared topic.)"""
    async with later_topic(kafka_cluster, "sessions-trimmed") as (topic, records), \
            connection(proxy) as conn, connection(proxy) as probe:
        # All local: the session's full fetch reads partition 1's first batch only.
        first = await conn.request(session_fetch(topic, {1: 0}, session_id=0, epoch=0, max_bytes=1))
        assert first.error_code == 0 and first.session_id != 0
        position = next_position(answered(first)[1].records, 0)
        assert position > 0 and handled == []
        later = await tier_partition_1(kafka_cluster, tiered, topic, records)
        assert later.boundary[1] > position
        # Another connection waits until the proxy's metadata refresh has seen the segments.
        for _ in range(100):
            (probed,) = answered(await probe.request(fetch_at(topic, position, 1))).values()
            if probed.error_code == 0 and probed.records:
                break
            await asyncio.sleep(0.1)
        seen = len(handled)
        moved = await conn.request(session_fetch(topic, {1: position}, session_id=first.session_id, epoch=1))
        assert moved.error_code == 0 and moved.session_id == first.session_id
        (partition,) = answered(moved).values()
        assert partition.error_code == 0, partition
        assert data_offsets(partition.records, position)[0] == position
        assert len(handled) == seen + 1
