"""Remote segments as files under a local directory: the embedded default backend.

An object key is a path below `root`. Every write goes to a hidden temp file in
the target directory, is fsynced, renamed over the target and the directory
fsynced, so a crash leaves either the old object or the new one, never half of one.
File I/O runs in worker threads, in chunks, so the event loop never blocks on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path

from .errors import RemoteResourceNotFound, RemoteStorageError
from .files import atomic_write, fsync_directory
from .encryption import KeyRing
from .manifest import Crc32cAccumulator, ObjectEntry
from .model import TopicIdPartition
from .rsm import ObjectStoreRemoteStorageManager, partition_key_prefix

# As large as the proxy's default chunk (remote.log.chunk.size.bytes), so that a chunk is
# read in one pread and reaches the cache as that one buffer, not copied together from pieces.
DEFAULT_CHUNK_BYTES = 4 << 20

# Conditions that may clear by themselves; anything else (permissions, a file
# where a directory should be) needs an operator.
_RETRIABLE_ERRNOS = {errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ENOSPC, errno.EIO, errno.EMFILE, errno.ENFILE}


class LocalRemoteStorageManager(ObjectStoreRemoteStorageManager):
    def __init__(
        self,
        root: Path,
        *,
        prefix: str = "",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        manifest_cache_size: int = 1024,
        keys: KeyRing | None = None,
    ) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        super().__init__(prefix=prefix, manifest_cache_size=manifest_cache_size, keys=keys)
        self.root = Path(root)
        self.chunk_bytes = chunk_bytes

    def path_of(self, key: str) -> Path:
        """The file holding the object `key`."""
        return self.root.joinpath(*key.split("/"))

    def _where(self, key: str) -> str:
        return str(self.path_of(key))

    async def close(self) -> None:
        pass  # no open handles outlive a call

    # -- primitives -------------------------------------------------------------

    async def _put_stream(self, key: str, chunks: Iterator[bytes], size: int) -> ObjectEntry:
        with _storage_errors(key):
            return await asyncio.to_thread(self._write_atomically, key, lambda: chunks)

    async def _put_bytes(self, key: str, data: bytes) -> None:
        with _storage_errors(key):
            await asyncio.to_thread(self._write_atomically, key, lambda: iter((data,)))

    async def _get_bytes(self, key: str) -> bytes:
        with _storage_errors(key):
            return await asyncio.to_thread(self.path_of(key).read_bytes)

    @contextlib.asynccontextmanager
    async def _open_range(self, key: str, first: int, last: int,
                          into: Sequence[memoryview] = ()
                          ) -> AsyncIterator[tuple[int, AsyncGenerator[bytes | memoryview, None]]]:
        with _storage_errors(key):
            fd = await asyncio.to_thread(os.open, self.path_of(key), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            # Into one buffer only: runs are read buffer by buffer here (`reads_runs`).
            yield os.fstat(fd).st_size, self._pread_chunks(key, fd, first, last, into[0] if len(into) == 1 else None)
        finally:
            os.close(fd)

    async def _pread_chunks(self, key: str, fd: int, first: int, last: int,
                            into: memoryview | None) -> AsyncGenerator[bytes | memoryview, None]:
        position = first
        while position <= last:
            size = min(self.chunk_bytes, last - position + 1)
            with _storage_errors(key):
                if into is None:
                    chunk: bytes | memoryview = await asyncio.to_thread(os.pread, fd, size, position)
                else:  # into the caller's (reused) buffer: no fresh memory to fault in
                    target = into[position - first:position - first + size]
                    chunk = target[:await asyncio.to_thread(os.preadv, fd, [target], position)]
            if not chunk:
                return  # the file shrank under us; the caller counts the bytes
            position += len(chunk)
            yield chunk

    async def _object_size(self, key: str) -> int | None:
        try:
            with _storage_errors(key):
                return (await asyncio.to_thread(os.stat, self.path_of(key))).st_size
        except RemoteResourceNotFound:
            return None

    async def _delete(self, keys: Iterable[str]) -> None:
        paths = [self.path_of(key) for key in keys]
        with _storage_errors(", ".join(map(str, paths))):
            await asyncio.to_thread(_unlink_all, paths)

    async def _list(self, key_prefix: str) -> list[str]:
        with _storage_errors(key_prefix):
            return await asyncio.to_thread(self._list_sync, key_prefix)

    # -- partition removal also removes its now empty directories -----------------

    async def delete_partition(self, topic_id_partition: TopicIdPartition) -> None:
        await super().delete_partition(topic_id_partition)
        # Only here: pruning after a single segment delete would race with a copy
        # into the same partition that has made the directory but not its file yet.
        partition_dir = self.path_of(partition_key_prefix(self.prefix, topic_id_partition).rstrip("/"))
        with _storage_errors(str(partition_dir)):
            await asyncio.to_thread(_remove_empty_dirs, partition_dir, self.root)

    # -- blocking helpers, run in worker threads ------------------------------------

    def _write_atomically(self, key: str, chunks: Callable[[], Iterable[bytes]]) -> ObjectEntry:
        target = self.path_of(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        crc = Crc32cAccumulator()
        with atomic_write(target) as out:
            for chunk in chunks():
                crc.update(chunk)
                out.write(chunk)
        return crc.entry()

    def _list_sync(self, key_prefix: str) -> list[str]:
        directory_key, _, name_prefix = key_prefix.rpartition("/")
        directory = self.path_of(directory_key) if directory_key else self.root
        keys = []
        for dirpath, _, filenames in os.walk(directory):
            relative = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                key = name if relative == "." else f"{relative}/{name}"
                if key.startswith(key_prefix):
                    keys.append(key)
        return keys


def _unlink_all(paths: list[Path]) -> None:
    directories = set()
    for path in paths:
        try:
            path.unlink()
            directories.add(path.parent)
        except FileNotFoundError:
            pass
    for directory in directories:
        fsync_directory(directory)


def _remove_empty_dirs(directory: Path, root: Path) -> None:
    """Remove `directory` and then its parents up to (not including) `root`, while empty."""
    root = root.resolve()
    directory = directory.resolve()
    while directory != root and root in directory.parents:
        try:
            directory.rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return
            raise
        directory = directory.parent


@contextlib.contextmanager
def _storage_errors(what: str) -> Iterator[None]:
    """Map OSError to the storage errors; `what` names the object in the message."""
    try:
        yield
    except FileNotFoundError as e:
        raise RemoteResourceNotFound(f"{what} not found") from e
    except OSError as e:
        raise RemoteStorageError(f"{what}: {e}", retriable=e.errno in _RETRIABLE_ERRNOS) from e
