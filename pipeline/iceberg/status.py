"""What `tierproxy status` says of each topic's table: per partition the next offset the table
holds up to, its lag behind the tier (remote segments and offsets not yet in it), and the rows
of its dead-letter table. Reads the catalog only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tierproxy.config import Config
from tierproxy.storage.model import RemoteLogSegmentMetadata

from .commit import table_offsets
from .settings import load_catalog, table_settings
from .dead_letters import dead_letter_table


@dataclass(frozen=True, slots=True)
class TableStatus:
    table: str
    exists: bool
    #: partition -> the next offset not in the table (0: none of it yet)
    committed: Mapping[int, int] = field(default_factory=dict)
    lag_segments: int = 0  # remote segments with offsets not in the table
    lag_offsets: int = 0  # remote offsets not in the table (control records and aborted ones included)
    dead_letters: int = 0
    error: str | None = None


def table_status(config: Config, topic: str, topic_id: str,
                 finished: Mapping[int, Sequence[RemoteLogSegmentMetadata]]) -> TableStatus:
    """`finished`: partition -> its COPY_SEGMENT_FINISHED segments."""
    from pyiceberg.exceptions import NoSuchTableError

    settings = table_settings(config, topic)
    catalog = load_catalog(config)
    try:
        table = catalog.load_table(settings.identifier)
    except NoSuchTableError:
        table = None
    held = table_offsets(table).for_topic(topic_id) if table is not None else {}
    committed = {p: held.get(p, 0) for p in sorted(finished)}
    lag_segments = lag_offsets = 0
    for partition, segments in finished.items():
        next_offset = committed[partition]
        behind = [s for s in segments if s.end_offset >= next_offset]
        lag_segments += len(behind)
        lag_offsets += sum(s.end_offset + 1 - max(s.start_offset, next_offset) for s in behind)
    return TableStatus(settings.name, table is not None, committed, lag_segments, lag_offsets,
                       _rows(catalog, (settings.namespace, dead_letter_table(settings.topic))))


def _rows(catalog: Any, identifier: tuple[str, str]) -> int:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        snapshot = catalog.load_table(identifier).current_snapshot()
    except NoSuchTableError:
        return 0
    return int(snapshot.summary.additional_properties.get("total-records", 0)) if snapshot is not None else 0


def format_tables(tables: Sequence[TableStatus]) -> list[str]:
    from tierproxy.config.tables import text_table

    rows = [("TABLE", "COMMITTED (partition:next offset)", "LAG SEGMENTS", "LAG OFFSETS", "DEAD LETTERS")]
    for t in tables:
        if t.error:
            rows.append((t.table, f"ERROR {t.error}", "-", "-", "-"))
            continue
        committed = " ".join(f"{p}:{o}" for p, o in sorted(t.committed.items())) if t.exists else "(no table yet)"
        rows.append((t.table, committed, str(t.lag_segments), str(t.lag_offsets), str(t.dead_letters)))
    return text_table(rows, right_aligned=range(2, 5))
