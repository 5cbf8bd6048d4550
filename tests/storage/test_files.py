"""Crash-safe writes: the new content whole, or the old one untouched and no temp file left."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierproxy.storage.files import TEMP_SUFFIX, atomic_write, fsync_directory, write_atomically


def test_write_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "state"
    write_atomically(target, b"old")
    write_atomically(target, b"new", sync_directory=False)
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["state"]


def test_streamed_write(tmp_path: Path) -> None:
    target = tmp_path / "object"
    with atomic_write(target) as out:
        for chunk in (b"a" * 10, b"b" * 5):
            out.write(chunk)
        assert not target.exists()  # nothing visible before the block ends
        (temp,) = tmp_path.iterdir()
        assert temp.name.startswith(".object.") and temp.name.endswith(TEMP_SUFFIX)
    assert target.read_bytes() == b"a" * 10 + b"b" * 5


def test_a_failed_write_leaves_the_old_content_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "state"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_write(target) as out:
            out.write(b"half")
            raise RuntimeError("cut short")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["state"]


def test_fsync_directory(tmp_path: Path) -> None:
    fsync_directory(tmp_path)
    with pytest.raises(FileNotFoundError):
        fsync_directory(tmp_path / "missing")
