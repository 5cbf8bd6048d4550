"""Crash-safe file writes: a temp file beside the target, fsync, rename, directory fsync.

A crash leaves either the old file or the new one, never half of one; what it can leave
is a hidden temp file (`.<name>.<random>.tmp`), which readers skip and may delete.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ("TEMP_SUFFIX", "atomic_write", "fsync_directory", "write_atomically")

TEMP_SUFFIX = ".tmp"


@contextlib.contextmanager
def atomic_write(path: Path, *, sync_directory: bool = True) -> Iterator[BinaryIO]:
    """The open temp file to write `path`'s new content to (streamed, as the caller likes).

    When the block ends normally the file is fsynced and renamed over `path`, then (with
    `sync_directory`) the directory is fsynced so that the rename survives a crash; when it
    raises, the temp file is removed and `path` is untouched.
    """
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
    try:
        with open(temp, "xb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if sync_directory:
        fsync_directory(path.parent)


def write_atomically(path: Path, data: bytes, *, sync_directory: bool = True) -> None:
    """`path` replaced by `data` through `atomic_write`."""
    with atomic_write(path, sync_directory=sync_directory) as out:
        out.write(data)


def fsync_directory(directory: Path) -> None:
    """Put a directory's entries (a rename, a new or removed file) on disk."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
