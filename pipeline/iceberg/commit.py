"""Exactly once: what a table holds is what its snapshots say, and a pass's files become
visible in one commit or never.

Each commit of a pass carries in its snapshot summary (as Iceberg's Kafka Connect sink does
with consumer offsets) the topic id, the next offset of each partition after it
(`tierproxy.committed-offsets`, cumulative) and the ranges it added. The next pass resumes
from the newest snapshot that says so, so a retried or killed pass neither duplicates nor
skips. Before its tasks write anything, a pass names its write id in the table property
`tierproxy.pending-write`; its commit appends the files and removes that property in one
table transaction. A pass killed in between leaves the property: the next pass deletes the
files of that write id (named `00000-<task>-<write id>.parquet` under the table's data
location) before it writes its own. The pipeline's lock keeps passes one at a time; the
commit checks that nothing was committed since the pass planned, so a writer outside the
lock fails its commit rather than add a range twice.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

TOPIC_ID = "tierproxy.topic-id"
COMMITTED_OFFSETS = "tierproxy.committed-offsets"
ADDED_OFFSETS = "tierproxy.added-offsets"
WRITE_ID = "tierproxy.write-id"
PENDING_WRITE = "tierproxy.pending-write"


class ConcurrentCommit(RuntimeError):
    """The table changed since the pass planned: its files are not committed."""


@dataclass(frozen=True, slots=True)
class TableOffsets:
    """What a table holds of its topic: per partition the next offset not in it."""

    topic_id: str | None = None
    next_offsets: Mapping[int, int] = field(default_factory=dict)
    snapshot_id: int | None = None  # the table's current snapshot when read

    def for_topic(self, topic_id: str) -> Mapping[int, int]:
        """The next offsets, when they are of this topic id (a topic deleted and created again
        on the origin starts at its own beginning)."""
        return self.next_offsets if self.topic_id == topic_id else {}


def summary_properties(snapshot: Any) -> Mapping[str, str]:
    summary = snapshot.summary
    if summary is None:
        return {}
    return dict(summary.additional_properties)


def table_offsets(table: Any) -> TableOffsets:
    """From the newest snapshot of the current lineage that records offsets (maintenance
    snapshots carry them forward too)."""
    from pyiceberg.table.snapshots import ancestors_of

    current = table.current_snapshot()
    for snapshot in ancestors_of(current, table.metadata):
        properties = summary_properties(snapshot)
        if COMMITTED_OFFSETS in properties:
            offsets = {int(p): int(o) for p, o in json.loads(properties[COMMITTED_OFFSETS]).items()}
            return TableOffsets(properties.get(TOPIC_ID), offsets, current.snapshot_id if current else None)
    return TableOffsets(snapshot_id=current.snapshot_id if current else None)


def offsets_summary(offsets: TableOffsets) -> dict[str, str]:
    """The summary properties that say what the table holds (for a commit that keeps it)."""
    if offsets.topic_id is None:
        return {}
    return {TOPIC_ID: offsets.topic_id,
            COMMITTED_OFFSETS: json.dumps({str(p): o for p, o in sorted(offsets.next_offsets.items())})}


# ----------------------------------------------------------------------------- writes


def begin_write(table: Any) -> tuple[Any, str, int]:
    """Cleans what a killed pass left and names a new write id as pending; returns the
    table, the id and how many leftover files were deleted."""
    cleaned = 0
    leftover = table.properties.get(PENDING_WRITE)
    if leftover:
        cleaned = delete_files(table, files_of_write(table, leftover))
        log.warning("%s: deleted %d data file(s) of write %s, which was never committed",
                    ".".join(table.name()), cleaned, leftover)
    write_id = str(uuid.uuid4())
    with table.transaction() as tx:
        tx.set_properties({PENDING_WRITE: write_id})
    return table, write_id, cleaned


def commit_write(table: Any, write_id: str, data_files: list[Any], planned: TableOffsets, topic_id: str,
                 added: Mapping[int, tuple[int, int]]) -> Any:
    """Appends the write's files with the offsets they cover, if the table still holds what
    the pass planned from; returns the table after the commit."""
    table.refresh()
    now = table_offsets(table)
    if (now.topic_id, now.next_offsets) != (planned.topic_id, planned.next_offsets):
        delete_files(table, [f.file_path for f in data_files])
        raise ConcurrentCommit(f"{'.'.join(table.name())}: offsets were committed by another writer since this "
                               "pass planned; its files were deleted, the next pass reads from the new offsets")
    base = dict(planned.for_topic(topic_id))
    base.update({p: end for p, (_, end) in added.items()})
    properties = {
        **offsets_summary(TableOffsets(topic_id, base)),
        ADDED_OFFSETS: json.dumps({str(p): list(r) for p, r in sorted(added.items())}),
        WRITE_ID: write_id,
    }
    with table.transaction() as tx:
        if data_files or added:
            with tx.update_snapshot(snapshot_properties=properties).fast_append() as append:
                for data_file in data_files:
                    append.append_data_file(data_file)
        tx.remove_properties(PENDING_WRITE)
    return table


def abandon_write(table: Any, write_id: str) -> int:
    """Deletes a write's files after its pass failed (the property stays for the next pass
    when this fails too)."""
    try:
        deleted = delete_files(table, files_of_write(table, write_id))
        with table.transaction() as tx:
            tx.remove_properties(PENDING_WRITE)
        return deleted
    except Exception as e:  # the next pass cleans up
        log.warning("%s: files of write %s stay for the next pass: %s", ".".join(table.name()), write_id, e)
        return 0


# ----------------------------------------------------------------------------- files


def _filesystem(table: Any) -> tuple[Any, str]:
    """(pyarrow filesystem, path) of the table's data location."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    io = table.io
    if not isinstance(io, PyArrowFileIO):
        raise RuntimeError(f"{type(io).__name__}: only pyarrow's FileIO can list the files a killed pass left")
    location = table.properties.get("write.data.path") or f"{table.location()}/data"
    scheme, netloc, path = PyArrowFileIO.parse_location(location, io.properties)
    return io.fs_by_scheme(scheme, netloc), path


def files_of_write(table: Any, write_id: str) -> list[str]:
    """The data files named after `write_id`, below the table's data location."""
    from pyarrow.fs import FileSelector, FileType

    fs, path = _filesystem(table)
    infos = fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
    return [info.path for info in infos if info.type == FileType.File and write_id in info.base_name]


def delete_files(table: Any, paths: Iterable[str]) -> int:
    io = table.io
    count = 0
    for path in paths:
        io.delete(path if "://" in path else _with_scheme(table, path))
        count += 1
    return count


def _with_scheme(table: Any, path: str) -> str:
    """A path pyarrow listed, as a location the table's FileIO opens."""
    location = table.location()
    scheme = location.split("://", 1)[0]
    if scheme == "file":
        return f"file://{path}"
    return f"{scheme}://{path}"
