"""Remote log metadata published into the remote store (storage.metadata.bucket), on the
local store and on moto's S3 server: a reader with only the store sees exactly the metadata
store's state, follows what changes, pays one GET for a refresh with nothing new, never
reads a torn publication, and cannot write."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator

import pytest

from tierproxy.storage.errors import MetadataNotReady, RemoteLogMetadataError, RemoteStorageError
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.metadata import ProblemKind
from tierproxy.storage.metadata import bucket as bucket_module
from tierproxy.storage.metadata.bucket import (
    FOLDER,
    HEAD,
    MAX_CHANGE_OBJECTS,
    BucketMetadata,
    BucketRemoteLogMetadataManager,
    Head,
    publish,
)
from tierproxy.storage.metadata.serde import MetadataDecodeError
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tierproxy.storage.s3 import S3RemoteStorageManager
from tierproxy.storage.model import (RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState,
                                     RemotePartitionDeleteMetadata, RemotePartitionDeleteState, TopicIdPartition)
from tests.helpers.s3 import manager as s3_manager
from tests.helpers.metadata_history import TPS, history, state_of, tier

S = RemoteLogSegmentState
D = RemotePartitionDeleteState


@pytest.fixture(params=["local", "s3"])
async def rsm(request, tmp_path) -> AsyncIterator[LocalRemoteStorageManager]:
    if request.param == "local":
        store = LocalRemoteStorageManager(tmp_path / "remote", prefix="tiered")
    else:
        store = s3_manager(request.getfixturevalue("s3_server"))
    async with store:
        yield store


@pytest.fixture
async def primary(tmp_path) -> AsyncIterator[FileRemoteLogMetadataManager]:
    async with FileRemoteLogMetadataManager(tmp_path / "metadata") as rlmm:
        yield rlmm


async def reader(rsm, **kwargs) -> BucketRemoteLogMetadataManager:
    rlmm = BucketRemoteLogMetadataManager(rsm, refresh_interval_ms=3_600_000, **kwargs)
    await rlmm.start()
    return rlmm


async def test_a_reader_with_only_the_store_sees_the_metadata_store_and_follows_it(rsm, primary):
    await history(primary)
    await publish(rsm, primary.partition_states())
    follower = await reader(rsm)
    assert state_of(follower) == state_of(primary)
    assert sorted(follower.partitions(), key=str) == sorted(primary.partitions(), key=str)

    # A new segment, a deletion under way, the partition deletion finished: one change object.
    new = await tier(primary, TPS[0], 300, 399, epoch=3)
    await primary.update_remote_log_segment_metadata(
        RemoteLogSegmentMetadataUpdate(primary.list_segments(TPS[1])[0].segment_id, 13, S.DELETE_SEGMENT_STARTED, 2))
    for state in (D.DELETE_PARTITION_STARTED, D.DELETE_PARTITION_FINISHED):
        await primary.put_partition_delete(RemotePartitionDeleteMetadata(TPS[2], state, 14, 2))
    publication = await publish(rsm, primary.partition_states())
    assert (publication.partitions_changed, publication.compacted) == (3, False)
    assert state_of(follower) != state_of(primary)
    assert await follower.refresh() == 3
    assert state_of(follower) == state_of(primary)
    assert follower.segment_for(TPS[0], 350, 3).segment_id == new.segment_id
    assert follower.partition_delete_state(TPS[2]) == D.DELETE_PARTITION_FINISHED
    # A reader started now loads the snapshot and the change after it.
    assert state_of(await reader(rsm)) == state_of(primary)


async def test_a_refresh_with_nothing_published_costs_one_get(rsm, primary):
    await history(primary)
    await publish(rsm, primary.partition_states())
    follower = await reader(rsm)
    requests: list[str] = []
    rsm.observe_requests(lambda operation, seconds, ok: requests.append(operation))
    assert await follower.refresh() == 0
    await publish(rsm, primary.partition_states(), now_ms=follower.published_ms + 1000)  # nothing changed
    requests.clear()
    assert await follower.refresh() == 0
    if isinstance(rsm, LocalRemoteStorageManager):
        return  # the local store reports no requests; the count is the same code's
    assert requests == ["get"]
    assert follower.published_ms == follower.head.published_ms


async def test_a_publication_whose_head_was_not_replaced_is_never_read(rsm, primary, monkeypatch):
    await history(primary)
    await publish(rsm, primary.partition_states())
    follower = await reader(rsm)
    before = state_of(primary)
    await tier(primary, TPS[0], 300, 399, epoch=3)

    put_object = type(rsm).put_object

    async def head_fails(self, key, data):
        if key.endswith(f"{FOLDER}/{HEAD}"):
            raise RemoteStorageError("the store went away", retriable=True)
        await put_object(self, key, data)

    monkeypatch.setattr(type(rsm), "put_object", head_fails)
    with pytest.raises(RemoteStorageError):
        await publish(rsm, primary.partition_states())
    monkeypatch.undo()
    assert await follower.refresh() == 0
    assert state_of(follower) == before
    assert state_of(await reader(rsm)) == before

    await publish(rsm, primary.partition_states())  # the next one publishes what that one could not
    await follower.refresh()
    assert state_of(follower) == state_of(primary)


async def test_changes_are_compacted_into_a_new_snapshot_and_old_objects_removed(rsm, primary):
    await history(primary)
    await publish(rsm, primary.partition_states())
    follower = await reader(rsm)
    compactions = 0
    for i in range(MAX_CHANGE_OBJECTS + 2):
        await tier(primary, TPS[0], 300 + i * 100, 399 + i * 100, epoch=3)
        compactions += (await publish(rsm, primary.partition_states(), snapshot_object_bytes=256)).compacted
        await follower.refresh()
        assert state_of(follower) == state_of(primary)
    assert compactions >= 1  # by count or by weight: the changes never outgrow the snapshot by much
    assert len(follower.head.objects) - follower.head.snapshot_objects <= MAX_CHANGE_OBJECTS
    assert follower.head.snapshot_objects > 1  # cut into several objects, fetched concurrently
    assert state_of(await reader(rsm)) == state_of(primary)
    folder = f"{FOLDER}/"
    named = {HEAD, follower.head.index.name, *(o.name for o in follower.head.objects)}
    stored = {k.removeprefix(folder) for k in await rsm.list_objects(folder)}
    assert named <= stored and len(stored - named) <= 2 * MAX_CHANGE_OBJECTS  # only the replaced head's
    if isinstance(rsm, LocalRemoteStorageManager):  # below the store's key prefix, beside the partitions
        assert (rsm.root / "tiered" / FOLDER / HEAD).is_file()


async def test_the_remote_backend_is_read_only_and_keeps_its_scope(rsm, primary):
    await history(primary)
    await publish(rsm, primary.partition_states())
    some = await reader(rsm, partitions=TPS[:1])
    assert some.partitions() == [TPS[0]]
    assert state_of(some, TPS[:1]) == state_of(primary, TPS[:1])
    with pytest.raises(RemoteLogMetadataError, match="read-only"):
        await some.put_partition_delete(RemotePartitionDeleteMetadata(TPS[0], D.DELETE_PARTITION_MARKED, 1, 1))
    other = TopicIdPartition(uuid.uuid4(), "other", 0)
    assert (await reader(rsm)).list_segments(other) == []


async def test_a_store_without_published_metadata_is_a_problem_naming_where_it_looked(rsm, primary, caplog):
    """Not an empty log: nothing is loaded (every partition REPLICA_NOT_AVAILABLE), and the
    problem, logged once however many refreshes find it, names the bucket and key prefix."""
    follower = await reader(rsm)
    for _ in range(3):
        assert await follower.refresh() == 0
    assert follower.partitions() == [] and follower.published_ms is None
    assert not follower.is_loaded()
    problem = follower.problem
    assert problem is not None and problem.kind is ProblemKind.NO_METADATA
    assert problem.location == rsm.object_location(f"{FOLDER}/")
    assert ("s3://" if isinstance(rsm, S3RemoteStorageManager) else str(rsm.root)) in problem.location
    assert "/tiered/" in problem.location or isinstance(rsm, S3RemoteStorageManager)
    assert f"no remote log metadata under {problem.location}" in str(problem)
    assert _errors(caplog) == [str(problem)]
    with pytest.raises(MetadataNotReady, match="no remote log metadata under"):
        await follower.wait_until_ready(TPS[0], 30)  # at once, not after 30 s
    await history(primary)
    await publish(rsm, primary.partition_states())
    await follower.refresh()
    assert state_of(follower) == state_of(primary)
    assert follower.is_loaded() and follower.problem is None


def _errors(caplog) -> list[str]:
    """The ERROR lines of the metadata reader so far; none of them with a traceback."""
    records = [r for r in caplog.records if r.name == bucket_module.__name__ and r.levelno >= logging.ERROR]
    assert not any(r.exc_info for r in records)
    return [r.getMessage() for r in records]


async def _damage(rsm, how: str, name: str) -> tuple[str, bytes]:
    """Damages the metadata object `name` (garbage, cut in half, deleted); returns its
    location and its bytes before."""
    key = f"{FOLDER}/{name}"
    data = await rsm.get_object(key)
    if how == "garbage":
        await rsm.put_object(key, b"{not json")
    elif how == "truncated":
        await rsm.put_object(key, data[:len(data) // 2])
    else:
        await rsm.delete_objects([key])
    return rsm.object_location(key), data


async def _published_twice(rsm, primary) -> tuple:
    """A snapshot, then a change: (the head, the snapshot's first object, the change object)."""
    await history(primary)
    await publish(rsm, primary.partition_states())
    await tier(primary, TPS[0], 300, 399, epoch=3)
    assert not (await publish(rsm, primary.partition_states())).compacted
    head = await BucketMetadata(rsm).head()
    return head, head.objects[0].name, head.objects[-1].name


@pytest.mark.parametrize("damage", ["garbage head", "truncated snapshot", "missing change"])
async def test_damaged_metadata_never_stops_a_start_and_names_the_object(rsm, primary, damage, caplog):
    """A garbage head, a truncated snapshot object or a missing change object: the start
    goes on (other topics are served), nothing is loaded, and the problem names the object."""
    _, snapshot, change = await _published_twice(rsm, primary)
    how, name = {"garbage head": ("garbage", HEAD), "truncated snapshot": ("truncated", snapshot),
                 "missing change": ("missing", change)}[damage]
    location, before = await _damage(rsm, how, name)
    follower = BucketRemoteLogMetadataManager(rsm, refresh_interval_ms=3_600_000)
    try:
        await follower.start()
        for _ in range(2):
            assert await follower.refresh() == 0
        assert not follower.is_loaded() and follower.partitions() == []
        problem = follower.problem
        assert problem is not None and (problem.kind, problem.location) == (ProblemKind.DAMAGED, location)
        assert location in str(problem) and "REPLICA_NOT_AVAILABLE" in str(problem)
        assert _errors(caplog) == [str(problem)]
        with pytest.raises(MetadataNotReady):
            follower.log_end_offset(TPS[0])
        with pytest.raises(MetadataNotReady, match="cannot be read"):
            await follower.wait_until_ready(TPS[0], 30)
        await rsm.put_object(f"{FOLDER}/{name}", before)  # mended
        await follower.refresh()
        assert follower.problem is None and state_of(follower) == state_of(primary)
    finally:
        await follower.close()


@pytest.mark.parametrize("how", ["garbage", "truncated", "missing"])
async def test_a_reader_keeps_its_last_good_state_over_a_damaged_publication(rsm, primary, how, caplog):
    await history(primary)
    await publish(rsm, primary.partition_states())
    follower = await reader(rsm)
    good = state_of(follower)
    await tier(primary, TPS[0], 300, 399, epoch=3)
    await publish(rsm, primary.partition_states())
    head = await BucketMetadata(rsm).head()
    location, _ = await _damage(rsm, how, HEAD if how == "garbage" else head.objects[-1].name)
    for _ in range(3):
        assert await follower.refresh() == 0
    assert follower.is_loaded() and state_of(follower) == good
    problem = follower.problem
    assert problem is not None and (problem.kind, problem.location) == (ProblemKind.DAMAGED, location)
    assert f"serving generation {follower.head.generation} read before" in str(problem)
    assert _errors(caplog) == [str(problem)]


@pytest.mark.parametrize("damage", ["garbage head", "truncated index", "missing index"])
async def test_the_next_publication_mends_a_damaged_head_or_index(rsm, primary, damage, caplog):
    """The pipeline publishes over what it cannot read, whole, at a generation above every
    object in the folder: a reader that kept its last good state takes the new one."""
    head, _, _ = await _published_twice(rsm, primary)
    follower = await reader(rsm)
    how, name = {"garbage head": ("garbage", HEAD), "truncated index": ("truncated", head.index.name),
                 "missing index": ("missing", head.index.name)}[damage]
    await _damage(rsm, how, name)
    await tier(primary, TPS[1], 300, 399, epoch=3)
    publication = await publish(rsm, primary.partition_states())
    assert publication.compacted and publication.generation > head.generation
    assert any("publishing every partition's state anew" in r.getMessage() for r in caplog.records)
    await follower.refresh()
    assert follower.problem is None and state_of(follower) == state_of(primary)
    await follower.close()


async def test_a_head_removed_after_it_was_read_is_a_problem_and_the_state_stays(rsm, primary):
    await history(primary)
    await publish(rsm, primary.partition_states())
    follower = await reader(rsm)
    good = state_of(follower)
    await rsm.delete_objects([f"{FOLDER}/{HEAD}"])
    await follower.refresh()
    assert follower.is_loaded() and state_of(follower) == good
    assert follower.problem is not None and follower.problem.kind is ProblemKind.NO_METADATA
    assert follower.problem.location == rsm.object_location(f"{FOLDER}/{HEAD}")


async def test_a_store_that_cannot_be_reached_at_start_is_read_once_it_can(rsm, primary, monkeypatch):
    """A proxy in front of a replica cluster starts (and forwards everything else) while
    the store is down: its partitions are not ready until a refresh reads them."""
    await history(primary)
    await publish(rsm, primary.partition_states())
    down = [True]
    head = BucketMetadata.head

    async def unreachable(self):
        if down[0]:
            raise RemoteStorageError("connection refused", retriable=True)
        return await head(self)

    monkeypatch.setattr(BucketMetadata, "head", unreachable)
    follower = BucketRemoteLogMetadataManager(rsm, refresh_interval_ms=50)
    try:
        await follower.start()
        assert not follower.is_loaded()
        with pytest.raises(MetadataNotReady):
            await follower.wait_until_ready(TPS[0], 0.2)
        down[0] = False
        await follower.wait_until_ready(TPS[0], 10)
        assert state_of(follower) == state_of(primary)
    finally:
        await follower.close()


async def test_a_store_that_refuses_the_read_stops_the_start(rsm, monkeypatch):
    async def refused(self):
        raise RemoteStorageError("NoSuchBucket", retriable=False)

    monkeypatch.setattr(BucketMetadata, "head", refused)
    follower = BucketRemoteLogMetadataManager(rsm, refresh_interval_ms=50)
    with pytest.raises(RemoteStorageError, match="NoSuchBucket"):
        await follower.start()
    await follower.close()


async def test_the_head_carries_the_origins_partition_counts_over_publications(rsm, primary):
    """Each publication's counts go over those published before: a topic it does not count
    (the cluster could not be read) keeps its last count."""
    await history(primary)
    bucket = BucketMetadata(rsm)
    await publish(rsm, primary.partition_states(), topic_partitions={"wide": 6, "narrow": 2})
    assert (await bucket.head()).topic_partitions == {"wide": 6, "narrow": 2}
    await publish(rsm, primary.partition_states(), topic_partitions={"wide": 8})
    assert (await bucket.head()).topic_partitions == {"wide": 8, "narrow": 2}
    await publish(rsm, primary.partition_states())
    assert (await bucket.head()).topic_partitions == {"wide": 8, "narrow": 2}


async def test_a_head_published_before_the_counts_is_read_without_them(rsm, primary):
    await history(primary)
    await publish(rsm, primary.partition_states())
    raw = json.loads(await rsm.get_object(BucketMetadata.key(HEAD)))
    assert "topic_partitions" not in raw  # as a pipeline before the counts wrote it
    assert (await BucketMetadata(rsm).head()).topic_partitions is None
    follower = await reader(rsm)
    assert state_of(follower) == state_of(primary)
    with pytest.raises(MetadataDecodeError, match="does not decode"):
        Head.decode(json.dumps({**raw, "topic_partitions": ["wide"]}).encode())
