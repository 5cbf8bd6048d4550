"""Remote log metadata published into the remote store (storage.metadata.bucket), on the
local store and on moto's S3 server: a reader with only the store sees exactly the metadata
store's state, follows what changes, pays one GET for a refresh with nothing new, never
reads a torn publication, and cannot write."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest

from tierproxy.storage.errors import MetadataNotReady, RemoteLogMetadataError, RemoteStorageError
from tierproxy.storage.local import LocalRemoteStorageManager
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


async def test_a_store_without_published_metadata_is_empty_until_it_is_published(rsm, primary):
    follower = await reader(rsm)
    assert follower.partitions() == [] and follower.published_ms is None
    await history(primary)
    await publish(rsm, primary.partition_states())
    await follower.refresh()
    assert state_of(follower) == state_of(primary)


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
