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

With a typed format (`topic.<name>.iceberg.key.format` / `.value.format`), the table has the
decoded columns too (`dead_letters.decoded_fields`; an existing table evolves to a newer schema
by Iceberg's rules, or the table step fails saying why), and a task routes each record to the
table or, whole and raw with its reason, to the dead-letter table `<topic>__dlq`
(`dead_letters.route`). Both tables record their own offsets in their snapshots; the
dead-letter table commits first, then the table. The table's offsets decide what a pass reads,
so after a pass that stopped between the two commits the next one reads those records again,
and writes only the dead letters at or past the dead-letter table's own offsets.

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
from .dead_letters import decoded_fields, route
from .formats import Decoder, topic_decoders
from .rows import COLUMNS, table_rows
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
    cleaned: int = 0  # files of a killed pass deleted (both tables)
    dead_letters: int = 0  # records written to the dead-letter table
    #: partition -> (the table's next offset, the remote log start above it): records lost
    gaps: dict[int, tuple[int, int]] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class WriteTarget:
    """A table as a task writes to it."""

    metadata_json: str
    io_properties: dict[str, str]
    write_id: str


@dataclass(frozen=True, slots=True)
class DeadLetters:
    """Where a task writes the records that do not decode, and from which offset on."""

    target: WriteTarget
    #: partition -> the dead-letter table's next offset: dead letters below it are already there
    written_below: dict[int, int]


@dataclass(frozen=True, slots=True)
class Decoders:
    key: Decoder | None
    value: Decoder | None

    def __bool__(self) -> bool:
        return self.key is not None or self.value is not None


@dataclass(frozen=True, slots=True)
class SliceOutcome:
    """What one task hands back."""

    index: int
    data_files: list[Any]
    rows: int
    bytes: int
    dead_files: list[Any] = field(default_factory=list)
    dead_rows: int = 0


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
    decoders = Decoders(*topic_decoders(config, report.topic))
    table = load_or_create(catalog, settings, decoded=decoded_fields(COLUMNS, decoders.key, decoders.value))
    dlq = load_or_create(catalog, settings, dead_letters=True) if decoders else None
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
    dead: DeadLetters | None = None
    pending = [(table, write_id)]  # writes to abandon if the pass fails
    if dlq is not None:
        dlq_held = table_offsets(dlq)
        dlq, dlq_write_id, cleaned = begin_write(dlq)
        report.cleaned += cleaned
        pending.append((dlq, dlq_write_id))
        dead = DeadLetters(_target(dlq, dlq_write_id), dict(dlq_held.for_topic(topic_id)))
    print(f"[iceberg] {settings.name}: appending {len(slices)} segment(s) of {len(added)} partition(s)",
          file=stream, flush=True)
    try:
        outcomes = _run_write_job(config, spark, _target(table, write_id), dead, decoders, report.topic, slices,
                                  stream)
        if dlq is not None:
            # First, so that the table's offsets never pass a dead letter not yet committed.
            commit_write(dlq, dlq_write_id, [f for o in outcomes for f in o.dead_files], dlq_held, topic_id, added)
            pending.pop()  # committed: its files are the table's now
        data_files = [f for o in outcomes for f in o.data_files]
        commit_write(table, write_id, data_files, held, topic_id, added)
    except BaseException:
        for tbl, pending_id in pending:
            abandon_write(tbl, pending_id)
        raise
    report.added = added
    report.segments = len(slices)
    report.files = len(data_files)
    report.rows = sum(o.rows for o in outcomes)
    report.dead_letters = sum(o.dead_rows for o in outcomes)
    report.bytes = sum(o.bytes for o in outcomes)


def _target(table: Any, write_id: str) -> WriteTarget:
    return WriteTarget(table.metadata.model_dump_json(), dict(table.io.properties), write_id)


def _partition(piece: SegmentSlice) -> int:
    return piece.segment.topic_id_partition.partition


def _plan(config: Config, topic: str, held: TableOffsets) -> list[SegmentSlice]:
    options = ReadOptions(
        topic=topic, partitions=None,
        starting_offsets=OffsetBounds(EARLIEST, dict(held.next_offsets)), ending_offsets=OffsetBounds(LATEST),
        starting_timestamp=None, ending_timestamp=None, read_committed=True, config=config.raw())
    return asyncio.run(plan_slices(options))


def _run_write_job(config: Config, spark: Any, target: WriteTarget, dead: DeadLetters | None, decoders: Decoders,
                   topic: str, slices: list[SegmentSlice], stream: TextIO) -> list[SliceOutcome]:
    from tierproxy.pipeline.progress import CopyProgress
    from tierproxy.pipeline.spark import run_job

    group = f"tierproxy-iceberg-{uuid.uuid4().hex[:8]}"
    progress = CopyProgress(spark, group, len(slices), stream=stream, label="iceberg", done="appended",
                            unit="segments")
    task = _write_task(config.raw(), target, dead, decoders, topic, progress.accumulator)
    return run_job(spark, group, f"tierproxy iceberg: {topic}, {len(slices)} segment(s)", list(enumerate(slices)),
                   task, lambda final: progress.poll(final=final))


def _write_task(raw_config: dict[str, str], target: WriteTarget, dead: DeadLetters | None, decoders: Decoders,
                topic: str, accumulator: Any):
    """The function Spark runs per (index, slice)."""

    def run(item: tuple[int, SegmentSlice]) -> SliceOutcome:
        index, piece = item
        outcome = write_slice(parse(raw_config), piece, target, topic, index, decoders=decoders, dead=dead)
        key = f"{topic}-{_partition(piece)}@{piece.first_offset}"
        accumulator.add({key: (outcome.bytes, 1)})
        return outcome

    return run


def write_slice(config: Config, piece: SegmentSlice, target: WriteTarget, topic: str, index: int, *,
                decoders: Decoders = Decoders(None, None), dead: DeadLetters | None = None) -> SliceOutcome:
    """One slice's rows as Parquet data files of the table (and with decoders, the records that
    do not decode as data files of the dead-letter table `dead`), at most the target size of
    Arrow rows of each in memory at once."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if decoders and dead is None:
        raise ValueError("a typed table needs its dead-letter table")
    table = _FileWriter(target, index, config[ICEBERG_TARGET_FILE_SIZE_BYTES])
    letters = _FileWriter(dead.target, index, config[ICEBERG_TARGET_FILE_SIZE_BYTES]) if dead else None
    for batch in read_slice(config, piece, topic=topic, leader_epoch=True):
        rows = table_rows(batch)
        if letters is not None and dead is not None:
            routed = route(rows, decoders.key, decoders.value)
            rows = routed.rows
            # A slice is one segment of one partition.
            floor = dead.written_below.get(_partition(piece), 0)
            letters.add(routed.dead_letters.filter(pc.greater_equal(routed.dead_letters.column("offset"), pa.scalar(floor))))
        table.add(rows)
    table.flush()
    if letters is None:
        return SliceOutcome(index, table.data_files, table.rows, table.bytes)
    letters.flush()
    return SliceOutcome(index, table.data_files, table.rows, table.bytes + letters.bytes, letters.data_files,
                        letters.rows)


class _FileWriter:
    """Arrow rows of one table gathered up to the target size, then written as its data files."""

    def __init__(self, target: WriteTarget, index: int, target_bytes: int) -> None:
        from pyiceberg.io import load_file_io
        from pyiceberg.table.metadata import TableMetadataUtil

        self.metadata = TableMetadataUtil.parse_raw(target.metadata_json)
        self.io = load_file_io(target.io_properties, self.metadata.location)
        self.write_id = target.write_id
        self.target_bytes = target_bytes
        self.counter = itertools.count(index << _FILES_PER_TASK_BITS)
        self.data_files: list[Any] = []
        self.pending: list[Any] = []
        self.pending_bytes = self.rows = 0

    def add(self, rows: Any) -> None:
        if not rows.num_rows:
            return
        self.pending.append(rows)
        self.pending_bytes += rows.nbytes
        self.rows += rows.num_rows
        if self.pending_bytes >= self.target_bytes:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa
        from pyiceberg.io.pyarrow import _dataframe_to_data_files

        if self.pending:
            self.data_files.extend(_dataframe_to_data_files(self.metadata, pa.concat_tables(self.pending), self.io,
                                                            write_uuid=uuid.UUID(self.write_id),
                                                            counter=self.counter))
        self.pending.clear()
        self.pending_bytes = 0

    @property
    def bytes(self) -> int:
        return sum(f.file_size_in_bytes for f in self.data_files)


def format_reports(reports: list[TableReport]) -> list[str]:
    """Summary lines of the table step, one per table, then one per error."""
    lines = []
    for r in reports:
        ranges = ", ".join(f"{p} [{s}, {e})" for p, (s, e) in sorted(r.added.items())) or "nothing new"
        lines.append(f"iceberg {r.table}: {r.rows} rows, {r.segments} segment(s), {r.files} file(s), "
                     f"{r.bytes / MB:.1f} MB in {r.seconds:.1f}s; offsets {ranges}"
                     + (f"; {r.dead_letters} dead letter(s)" if r.dead_letters else "")
                     + (f"; {r.cleaned} file(s) of an uncommitted pass deleted" if r.cleaned else ""))
        for partition, (held, start) in sorted(r.gaps.items()):
            lines.append(f"GAP iceberg {r.table}: partition {partition}: offsets [{held}, {start}) left the remote "
                         "tier before the table had them")
    return lines


def table_errors(reports: list[TableReport]) -> list[str]:
    return [f"iceberg {r.table}: {r.error}" for r in reports if r.error]
