"""`tierproxy iceberg maintain`: what keeps a table small and fast, and row retention.

Per table, in this order, each commit carrying the table's offsets forward in its summary
(`commit.offsets_summary`) so the next pass still resumes from them:

1. Row retention: with `topic.<name>.iceberg.retention.ms` >= 0, rows whose timestamp is
   older than that are deleted (whole files dropped where the partition spec allows, else
   the files rewritten). The default, -1, keeps every row: remote retention deleting
   segments never deletes rows.
2. Compaction: in each partition of the spec, data files smaller than half of
   `iceberg.write.target.file.size.bytes` (one per segment a pass read, typically) are
   rewritten into as few files as that size allows, in one replace commit per partition.
3. Snapshot expiry: snapshots older than `iceberg.snapshot.max.age.ms` are expired (the
   current one never is), and the data files only they referenced are deleted.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from tierproxy.config import ICEBERG_SNAPSHOT_MAX_AGE_MS, ICEBERG_TARGET_FILE_SIZE_BYTES, Config
from tierproxy.pipeline.failures import log_failure

from .commit import offsets_summary, table_offsets
from .settings import load_catalog, table_settings
from .table import load_or_create

log = logging.getLogger(__name__)


@dataclass(slots=True)
class MaintenanceReport:
    table: str
    rows_deleted: bool = False
    files_compacted: int = 0  # small files replaced
    files_written: int = 0
    snapshots_expired: int = 0
    files_deleted: int = 0  # data files no snapshot references any more
    error: str | None = None


def maintain_tables(config: Config, topics: Iterable[str], *, now_ms: int | None = None) -> list[MaintenanceReport]:
    catalog = load_catalog(config)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    reports = []
    for topic in topics:
        settings = table_settings(config, topic)
        report = MaintenanceReport(settings.name)
        try:
            table = load_or_create(catalog, settings)
            if settings.retention_ms >= 0:
                report.rows_deleted = _apply_retention(table, now_ms - settings.retention_ms)
                table.refresh()
            compact(table, config[ICEBERG_TARGET_FILE_SIZE_BYTES], report)
            table.refresh()
            expire(table, now_ms - config[ICEBERG_SNAPSHOT_MAX_AGE_MS], report)
        except Exception as e:
            report.error = log_failure(log, logging.ERROR, f"maintaining iceberg table {settings.name}", e)
        reports.append(report)
    return reports


def _apply_retention(table: Any, cutoff_ms: int) -> bool:
    before = table.current_snapshot()
    cutoff = datetime.fromtimestamp(cutoff_ms / 1000, tz=timezone.utc).isoformat()
    table.delete(f"timestamp < '{cutoff}'", snapshot_properties=offsets_summary(table_offsets(table)))
    table.refresh()
    return table.current_snapshot() != before


def compact(table: Any, target_bytes: int, report: MaintenanceReport) -> None:
    from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files
    from pyiceberg.expressions import AlwaysTrue

    small: dict[tuple, list[Any]] = defaultdict(list)
    for task in table.scan().plan_files():
        if task.file.file_size_in_bytes < target_bytes // 2 and not task.delete_files:
            small[(task.file.spec_id, tuple(task.file.partition))].append(task)
    for tasks in small.values():
        if len(tasks) < 2:
            continue
        rows = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(tasks)
        rows = rows.sort_by([("partition", "ascending"), ("offset", "ascending")])
        written = list(_dataframe_to_data_files(table.metadata, rows, table.io))
        with table.transaction() as tx:
            properties = offsets_summary(table_offsets(table))
            with tx.update_snapshot(snapshot_properties=properties).overwrite() as replace:
                for task in tasks:
                    replace.delete_data_file(task.file)
                for data_file in written:
                    replace.append_data_file(data_file)
        table.refresh()
        report.files_compacted += len(tasks)
        report.files_written += len(written)


def _data_files(table: Any, snapshots: Iterable[Any]) -> set[str]:
    """Paths of the data files the snapshots reference."""
    from pyiceberg.manifest import ManifestEntryStatus

    paths = set()
    for snapshot in snapshots:
        for manifest in snapshot.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                if entry.status != ManifestEntryStatus.DELETED:
                    paths.add(entry.data_file.file_path)
    return paths


def expire(table: Any, older_than_ms: int, report: MaintenanceReport) -> None:
    current = table.current_snapshot()
    old = [s for s in table.snapshots() if s.timestamp_ms < older_than_ms
           and (current is None or s.snapshot_id != current.snapshot_id)]
    if not old:
        return
    before = _data_files(table, table.snapshots())
    table.maintenance.expire_snapshots().older_than(
        datetime.fromtimestamp(older_than_ms / 1000, tz=timezone.utc)).commit()
    table.refresh()
    gone = before - _data_files(table, table.snapshots())
    for path in gone:
        table.io.delete(path)
    report.snapshots_expired = len(old) - len(set(s.snapshot_id for s in table.snapshots()) &
                                              {s.snapshot_id for s in old})
    report.files_deleted = len(gone)


def format_maintenance(reports: list[MaintenanceReport]) -> list[str]:
    lines = []
    for r in reports:
        if r.error:
            lines.append(f"ERROR iceberg {r.table}: {r.error}")
            continue
        lines.append(f"iceberg {r.table}: {'old rows deleted, ' if r.rows_deleted else ''}"
                     f"{r.files_compacted} small file(s) compacted into {r.files_written}, "
                     f"{r.snapshots_expired} snapshot(s) expired, {r.files_deleted} data file(s) deleted")
    return lines
