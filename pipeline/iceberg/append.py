"""The table step of a pass: the records of every remote segment not yet in a topic's table,
appended to it exactly once.

Per enabled topic, on the driver: load (or create) the table and read what it holds from its
snapshots (`commit.table_offsets`); plan the remote segments from there on with the data
source's planner (`datasource.plan_slices`, read_committed: one slice per segment, aborted
transactions from the transaction indexes, nothing at or past the first transaction still
open); clean up what a killed pass left and name this write pending. On Spark, one task per
slice reads the segment from remote storage, turns its records into the table's rows and
writes them as Parquet data files of at most `iceberg.write.target.file.size.bytes` of Arrow
rows each (a task holds no more, whatever the segment's size), and hands back their Iceberg
`DataFile`s. The driver commits them in one append whose snapshot summary records the
offsets covered. The first pass after enabling a topic so backfills every remote segment.

A partition whose next offset in the table is below its remote log start lost records to
remote retention before the table had them: reported as a gap, and the table goes on from
the remote log start.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from tierproxy.config import ICEBERG_TARGET_FILE_SIZE_BYTES, Config, parse
from tierproxy.pipeline.datasource import (
    EARLIEST,
    LATEST,
    OffsetBounds,
    ReadOptions,
    SegmentSlice,
    plan_slices,
    read_slice,
)
from tierproxy.pipeline.failures import log_failure

from .commit import TableOffsets, abandon_write, begin_write, commit_write, table_offsets
from .rows import table_rows
from .settings import enabled_topics, load_catalog, table_settings
from .table import load_or_create

log = logging.getLogger(__name__)

MB = 1_000_000
# Files a task may write: its counter starts at slice index << _FILES_PER_TASK_BITS, so that
# names (00000-<counter>-<write id>.parquet) never meet across tasks.
_FILES_PER_TASK_BITS = 20


@dataclass(slots=True)
class TableReport:
    """What the table step did for one topic."""

    topic: str
    table: str
    #: partition -> [start, end) of the offsets this commit added
    added: dict[int, tuple[int, int]] = field(default_factory=dict)
    rows: int = 0
    files: int = 0
    bytes: int = 0  # Parquet bytes written
    segments: int = 0
    cleaned: int = 0  # files of a killed pass deleted
    #: partition -> (the table's next offset, the remote log start above it): records lost
    gaps: dict[int, tuple[int, int]] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class SliceOutcome:
    """What one task hands back."""

    index: int
    data_files: list[Any]
    rows: int
    bytes: int


def append_tables(config: Config, spark: Any, *, topics: Iterable[str] | None = None,
                  stream: TextIO | None = None) -> list[TableReport]:
    """The table step for `topics` (default: every topic with iceberg.enable=true). A topic's
    failure is in its report; the others go on."""
    stream = stream if stream is not None else sys.stderr
    reports: list[TableReport] = []
    names = list(topics) if topics is not None else enabled_topics(config)
    if not names:
        return reports
    catalog = None
    for topic in names:
        settings = table_settings(config, topic)
        report = TableReport(topic, settings.name)
        started = time.monotonic()
        try:
            catalog = catalog if catalog is not None else load_catalog(config)
            _append_topic(config, spark, catalog, report, stream)
        except Exception as e:
            report.error = log_failure(log, logging.ERROR, f"iceberg table {settings.name}", e)
        report.seconds = time.monotonic() - started
        reports.append(report)
    return reports


def _append_topic(config: Config, spark: Any, catalog: Any, report: TableReport, stream: TextIO) -> None:
    settings = table_settings(config, report.topic)
    table = load_or_create(catalog, settings)
    held = table_offsets(table)
    slices = _plan(config, report.topic, held)
    topic_id = str(slices[0].segment.topic_id_partition.topic_id) if slices else None
    if topic_id is not None and held.topic_id not in (None, topic_id):
        # The topic was deleted and created again on the origin: a new offset space.
        log.warning("%s: the topic's id is now %s (the table has %s): its offsets start anew",
                    settings.name, topic_id, held.topic_id)
        slices = _plan(config, report.topic, TableOffsets())
    if not slices:
        return
    assert topic_id is not None
    for partition, next_offset in held.for_topic(topic_id).items():
        first = min((s.first_offset for s in slices if _partition(s) == partition), default=None)
        if first is not None and first > next_offset:
            report.gaps[partition] = (next_offset, first)
            log.error("%s: partition %d: offsets [%d, %d) left the remote tier before the table had them",
                      settings.name, partition, next_offset, first)
    added: dict[int, tuple[int, int]] = {}
    for piece in slices:
        start, end = added.get(_partition(piece), (piece.first_offset, piece.end_offset))
        added[_partition(piece)] = (min(start, piece.first_offset), max(end, piece.end_offset))

    table, write_id, report.cleaned = begin_write(table)
    print(f"[iceberg] {settings.name}: appending {len(slices)} segment(s) of {len(added)} partition(s)",
          file=stream, flush=True)
    try:
        outcomes = _run_write_job(config, spark, table, write_id, report.topic, slices, stream)
        data_files = [f for o in outcomes for f in o.data_files]
        commit_write(table, write_id, data_files, held, topic_id, added)
    except BaseException:
        abandon_write(table, write_id)
        raise
    report.added = added
    report.segments = len(slices)
    report.files = len(data_files)
    report.rows = sum(o.rows for o in outcomes)
    report.bytes = sum(o.bytes for o in outcomes)


def _partition(piece: SegmentSlice) -> int:
    return piece.segment.topic_id_partition.partition


def _plan(config: Config, topic: str, held: TableOffsets) -> list[SegmentSlice]:
    options = ReadOptions(
        topic=topic, partitions=None,
        starting_offsets=OffsetBounds(EARLIEST, dict(held.next_offsets)), ending_offsets=OffsetBounds(LATEST),
        starting_timestamp=None, ending_timestamp=None, read_committed=True, config=config.raw())
    return asyncio.run(plan_slices(options))


def _run_write_job(config: Config, spark: Any, table: Any, write_id: str, topic: str, slices: list[SegmentSlice],
                   stream: TextIO) -> list[SliceOutcome]:
    from tierproxy.pipeline.progress import CopyProgress
    from tierproxy.pipeline.spark import run_job

    group = f"tierproxy-iceberg-{uuid.uuid4().hex[:8]}"
    progress = CopyProgress(spark, group, len(slices), stream=stream, label="iceberg", done="appended",
                            unit="segments")
    task = _write_task(config.raw(), table.metadata.model_dump_json(), dict(table.io.properties), write_id, topic,
                       progress.accumulator)
    return run_job(spark, group, f"tierproxy iceberg: {topic}, {len(slices)} segment(s)", list(enumerate(slices)),
                   task, lambda final: progress.poll(final=final))


def _write_task(raw_config: dict[str, str], metadata_json: str, io_properties: dict[str, str], write_id: str,
                topic: str, accumulator: Any):
    """The function Spark runs per (index, slice)."""

    def run(item: tuple[int, SegmentSlice]) -> SliceOutcome:
        index, piece = item
        outcome = write_slice(parse(raw_config), piece, metadata_json, io_properties, write_id, topic, index)
        key = f"{topic}-{_partition(piece)}@{piece.first_offset}"
        accumulator.add({key: (outcome.bytes, 1)})
        return outcome

    return run


def write_slice(config: Config, piece: SegmentSlice, metadata_json: str, io_properties: dict[str, str],
                write_id: str, topic: str, index: int) -> SliceOutcome:
    """One slice's rows as Parquet data files of the table, at most the target size of Arrow
    rows in memory at once."""
    import pyarrow as pa
    from pyiceberg.io import load_file_io
    from pyiceberg.io.pyarrow import _dataframe_to_data_files
    from pyiceberg.table.metadata import TableMetadataUtil

    metadata = TableMetadataUtil.parse_raw(metadata_json)
    io = load_file_io(io_properties, metadata.location)
    target = config[ICEBERG_TARGET_FILE_SIZE_BYTES]
    counter = itertools.count(index << _FILES_PER_TASK_BITS)
    data_files: list[Any] = []
    pending: list[pa.Table] = []
    pending_bytes = rows = 0

    def flush() -> None:
        nonlocal pending_bytes
        if pending:
            data_files.extend(_dataframe_to_data_files(metadata, pa.concat_tables(pending), io,
                                                       write_uuid=uuid.UUID(write_id), counter=counter))
        pending.clear()
        pending_bytes = 0

    for batch in read_slice(config, piece, topic=topic, leader_epoch=True):
        part = table_rows(batch)
        pending.append(part)
        pending_bytes += part.nbytes
        rows += part.num_rows
        if pending_bytes >= target:
            flush()
    flush()
    return SliceOutcome(index, data_files, rows, sum(f.file_size_in_bytes for f in data_files))


def format_reports(reports: list[TableReport]) -> list[str]:
    """Summary lines of the table step, one per table, then one per error."""
    lines = []
    for r in reports:
        ranges = ", ".join(f"{p} [{s}, {e})" for p, (s, e) in sorted(r.added.items())) or "nothing new"
        lines.append(f"iceberg {r.table}: {r.rows} rows, {r.segments} segment(s), {r.files} file(s), "
                     f"{r.bytes / MB:.1f} MB in {r.seconds:.1f}s; offsets {ranges}"
                     + (f"; {r.cleaned} file(s) of an uncommitted pass deleted" if r.cleaned else ""))
        for partition, (held, start) in sorted(r.gaps.items()):
            lines.append(f"GAP iceberg {r.table}: partition {partition}: offsets [{held}, {start}) left the remote "
                         "tier before the table had them")
    return lines


def table_errors(reports: list[TableReport]) -> list[str]:
    return [f"iceberg {r.table}: {r.error}" for r in reports if r.error]
