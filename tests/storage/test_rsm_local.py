"""The local filesystem backend against the RemoteStorageManager contract."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tierproxy.storage.errors import RemoteResourceNotFound, RemoteStorageError
from tierproxy.storage.model import IndexType
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.rsm import ObjectType, RemoteStorageManager

from tierproxy.storage.encryption import KeyRing

from .rsm_contract import EncryptedRemoteStorageManagerContract, RemoteStorageManagerContract, Segment, make_segment


class TestLocalRemoteStorageManager(RemoteStorageManagerContract):
    @pytest_asyncio.fixture(loop_scope="function")
    async def rsm(self, tmp_path: Path) -> AsyncIterator[LocalRemoteStorageManager]:
        # Small chunks so a 12 MiB segment is read in many pieces, as S3 reads it in parts.
        async with LocalRemoteStorageManager(tmp_path / "remote", prefix="tiered", chunk_bytes=64 * 1024) as rsm:
            yield rsm

    async def raw_write(self, rsm: RemoteStorageManager, key: str, data: bytes) -> None:
        assert isinstance(rsm, LocalRemoteStorageManager)
        rsm.path_of(key).write_bytes(data)

    async def raw_delete(self, rsm: RemoteStorageManager, key: str) -> None:
        assert isinstance(rsm, LocalRemoteStorageManager)
        rsm.path_of(key).unlink()

    async def raw_read(self, rsm: RemoteStorageManager, key: str) -> bytes | None:
        assert isinstance(rsm, LocalRemoteStorageManager)
        path = rsm.path_of(key)
        return path.read_bytes() if path.exists() else None


class TestLocalRemoteStorageManagerEncrypted(EncryptedRemoteStorageManagerContract, TestLocalRemoteStorageManager):
    @pytest_asyncio.fixture(loop_scope="function")
    async def rsm(self, tmp_path: Path, keys: KeyRing) -> AsyncIterator[LocalRemoteStorageManager]:
        async with LocalRemoteStorageManager(tmp_path / "remote", prefix="tiered", chunk_bytes=64 * 1024,
                                             keys=keys) as rsm:
            yield rsm

    def other_manager(self, rsm: RemoteStorageManager, keys: KeyRing) -> RemoteStorageManager:
        assert isinstance(rsm, LocalRemoteStorageManager)
        return LocalRemoteStorageManager(rsm.root, prefix=rsm.prefix, chunk_bytes=rsm.chunk_bytes, keys=keys)


@contextlib.asynccontextmanager
async def _copied(tmp_path: Path, **options: object) -> AsyncIterator[tuple[LocalRemoteStorageManager, Segment]]:
    """A 1000-byte segment copied to a local store under tmp_path / "remote" (`options` for the store)."""
    segment = make_segment(tmp_path / "local", log_size=1000)
    async with LocalRemoteStorageManager(tmp_path / "remote", **options) as rsm:
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        yield rsm, segment


async def test_objects_are_files_under_the_root(tmp_path: Path) -> None:
    root = tmp_path / "remote"
    async with _copied(tmp_path) as (rsm, segment):
        log_key = rsm._key(segment.metadata, ObjectType.LOG)
    assert (root / log_key).read_bytes() == segment.log
    # Written to a temp name and renamed: no temp file is left behind.
    assert not [p for p in root.rglob("*") if p.name.startswith(".")]


async def test_delete_partition_removes_its_directories(tmp_path: Path) -> None:
    root = tmp_path / "remote"
    async with _copied(tmp_path, prefix="p") as (rsm, segment):
        await rsm.delete_partition(segment.metadata.topic_id_partition)
    assert root.is_dir()
    assert list(root.rglob("*")) == []


async def test_leftover_temp_file_is_removed_with_the_partition(tmp_path: Path) -> None:
    # A crash between writing a temp file and renaming it leaves the temp file.
    async with _copied(tmp_path) as (rsm, segment):
        log_path = rsm.path_of(rsm._key(segment.metadata, ObjectType.LOG))
        (log_path.parent / f".{log_path.name}.dead.tmp").write_bytes(b"half")
        tip = segment.metadata.topic_id_partition
        assert len(await rsm.list_partition_objects(tip)) == len(ObjectType) + 1
        await rsm.delete_partition(tip)
        assert await rsm.list_partition_objects(tip) == []


async def test_missing_local_source_file_is_not_a_missing_remote_object(tmp_path: Path) -> None:
    segment = make_segment(tmp_path / "local", log_size=1000)
    segment.data.offset_index.unlink()
    async with LocalRemoteStorageManager(tmp_path / "remote") as rsm:
        with pytest.raises(RemoteStorageError) as raised:
            await rsm.copy_log_segment_data(segment.metadata, segment.data)
    assert type(raised.value) is RemoteStorageError
    assert not raised.value.retriable
    assert str(segment.data.offset_index) in str(raised.value)


async def test_os_errors_become_storage_errors(tmp_path: Path) -> None:
    async with _copied(tmp_path) as (rsm, segment):
        # A directory where the offset index should be: reading it fails with EISDIR.
        path = rsm.path_of(rsm._key(segment.metadata, ObjectType.OFFSET_INDEX))
        path.unlink()
        path.mkdir()
        with pytest.raises(RemoteStorageError) as raised:
            await rsm.fetch_index(segment.metadata, IndexType.OFFSET)
    assert type(raised.value) is RemoteStorageError
    assert not raised.value.retriable
    assert isinstance(raised.value.__cause__, IsADirectoryError)


async def test_chunk_size_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        LocalRemoteStorageManager(tmp_path, chunk_bytes=0)


async def test_a_cold_segments_index_is_asked_for_beside_its_manifest(tmp_path: Path) -> None:
    """Cold (no manifest cached), the index's GET goes out before the manifest's answer is
    back, not a round trip after it; warm, the index alone is read. An index the manifest
    does not list is still not found, and nothing read early is left unretrieved."""
    segment = make_segment(tmp_path / "segment", with_txn_index=False)
    async with LocalRemoteStorageManager(tmp_path / "store") as rsm:
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
    events: list[tuple[str, ObjectType]] = []
    async with LocalRemoteStorageManager(tmp_path / "store") as cold:
        get_bytes = cold._get_bytes

        async def get(key: str) -> bytes:
            events.append(("asked", ObjectType.of_key(key)))
            await asyncio.sleep(0.05)
            data = await get_bytes(key)
            events.append(("got", ObjectType.of_key(key)))
            return data

        cold._get_bytes = get  # type: ignore[method-assign]
        assert await cold.fetch_index(segment.metadata, IndexType.OFFSET) == segment.indexes[IndexType.OFFSET]
        assert set(events[:2]) == {("asked", ObjectType.MANIFEST), ("asked", ObjectType.OFFSET_INDEX)}
        events.clear()
        assert await cold.fetch_index(segment.metadata, IndexType.TIMESTAMP) == segment.indexes[IndexType.TIMESTAMP]
        assert events == [("asked", ObjectType.TIME_INDEX), ("got", ObjectType.TIME_INDEX)]
        cold._forget(segment.metadata)
        events.clear()
        with pytest.raises(RemoteResourceNotFound):
            await cold.fetch_index(segment.metadata, IndexType.TRANSACTION)
        assert ("asked", ObjectType.TRANSACTION_INDEX) not in events  # the metadata says it has none
