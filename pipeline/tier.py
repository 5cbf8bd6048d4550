"""One tiering pass, and the `--every` loop that repeats it.

A pass (KIP-405's RLM leader task, run as a Spark job):

1. Plan on the driver (`pipeline.plan`): per tiered partition the broker's local log start
   offset and last stable offset (ListOffsets) and the remote log end offset (the metadata
   manager, COPY_SEGMENT_FINISHED segments only). The copy range is
   [max(remote end + 1, local start), last stable offset). A remote end + 1 below the local
   start is a gap (data deleted before it was tiered): logged as an error, shown in the
   summary, and copying resumes at the local start. Nothing at or above the last stable
   offset is ever copied.
2. Clean leftovers of earlier passes: every COPY_SEGMENT_STARTED segment of a planned
   partition is an orphan, since no copy runs now (`pipeline.commit.clean_orphans`). A
   partition with something to copy has them cleaned by its commit (step 4), after the
   copy, so that with the store down its summary names the failed upload first, and the
   failed cleanup after it.
3. Copy in Spark (`pipeline.copy`): one task per partition with a non-empty range, in
   parallel across executors. A task cuts segments of `segment.bytes` (or older than
   `segment.ms`) from raw fetched batches, adds each as COPY_SEGMENT_STARTED under a fresh
   segment id, uploads it, and returns the metadata. It never marks anything FINISHED.
   A task that keeps failing up to its last allowed attempt returns its error instead of
   failing the job, so the other partitions' work is still committed. With
   `remote.log.manager.copy.max.bytes.per.second` (KIP-956) each task running at once gets
   an equal share of the quota and waits before a segment while its share is exceeded
   (`storage.quota`, Kafka's rate semantics).
4. Commit on the driver (`pipeline.commit`), exactly one winner per range: the segments of
   the one successful attempt `collect()` returns are verified in remote storage and moved
   to COPY_SEGMENT_FINISHED in offset order, each only if it starts at the remote end + 1.
   Every other STARTED segment (failed attempts, speculative duplicates) is deleted through
   DELETE_SEGMENT_STARTED -> objects deleted -> DELETE_SEGMENT_FINISHED.
5. Retention (`tierproxy.pipeline.retention.run_retention`): DeleteRecords on the broker over data now
   FINISHED remotely, remote expiry, removal of deleted topics' partitions; then the
   remote data of topics whose remote storage was turned off (KIP-950,
   `pipeline.remote_storage_disable`): deleted with `remote.log.delete.on.disable=true`,
   else refused with Kafka's message.
6. A summary on stdout: a table of partitions, the range copied and committed, segments,
   bytes, MB/s, trimmed, expired (or one JSON document with `--json`). A failing
   cluster, store or metadata manager ends the pass with one line in the summary and
   the log, never a traceback, and the summary still shows what was done before.

One pipeline at a time: a pass holds an exclusive `flock` on
`<remote.log.metadata.dir>/tier.lock`, and a second pass fails at once (`PipelineBusy`).
Orphan cleanup relies on it. With the topic metadata backend that directory is local to
the driver's machine, so the lock covers only pipelines started on the same machine: run
one `tierproxy tier` per cluster. Speculative execution (`spark.speculation`) is safe for
the metadata (losers are cleaned), but a losing attempt Spark fails to stop before the
commit may upload after its cleanup; its STARTED record is cleaned by the next pass.

The file metadata backend is written by the driver and the tasks at once (shared writers,
one flock per append), so with it the executors must see the driver's
`remote.log.metadata.dir`: local[*], or a standalone cluster on one machine.

`--every`: passes repeat every interval (`remote.log.manager.task.interval.ms` by default),
and `pipeline.metrics` on `pipeline.metrics.port` says how they went.
A failed pass is logged and retried after Kafka's exponential backoff (`storage.backoff`):
`remote.log.manager.task.retry.backoff.ms`, doubling up to `...retry.backoff.max.ms`, with
`...retry.jitter` (never later than the interval). SIGINT and SIGTERM stop
the loop after the current pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tierproxy.client.cluster import Cluster
from tierproxy.config import Config, ConfigError, REMOTE_LOG_METADATA_BACKEND, REMOTE_LOG_METADATA_DIR
from tierproxy.config.tables import text_table
from tierproxy.storage.backoff import ExponentialBackoff
from tierproxy.storage.errors import RemoteLogMetadataError, RemoteStorageError
from tierproxy.storage.factory import remote_storage_manager
from tierproxy.storage.quota import QuotaSettings, RateQuota, copy_quota_settings

from .commit import CommitResult, clean_orphans, commit_partition, publishing_metadata
from .copy import CopyResult, copy_task, metadata_manager
from .dry_run import dry_pass
from .failures import log_failure, one_line
from .metrics import PipelineMetrics
from .plan import PartitionPlan, plan_pass, tiered_partition_counts
from .remote_log_stats import RemoteLogStats, remote_log_stats
from .remote_storage_disable import RemoteStorageDisableResult, apply_remote_storage_disable

log = logging.getLogger(__name__)

LOCK_FILE_NAME = "tier.lock"
MB = 1_000_000


class PipelineBusy(RuntimeError):
    """Another tiering pass holds the pipeline's lock."""


@contextlib.contextmanager
def pipeline_lock(config: Config) -> Iterator[None]:
    directory = Path(config[REMOTE_LOG_METADATA_DIR])
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PipelineBusy(f"another tiering pass is running (lock {directory / LOCK_FILE_NAME})") from None
        yield
    finally:
        os.close(fd)  # releases the flock


@dataclass(slots=True)
class PartitionSummary:
    plan: PartitionPlan
    segments: int = 0
    bytes: int = 0
    pending_bytes: int = 0
    cleaned: int = 0
    error: str | None = None
    throttle_waits: list[float] = field(default_factory=list)  # seconds each copy waited for the quota
    uploaded: int = 0  # segments the copy task uploaded (committed or not)
    copy_failed: bool = False
    cleanup_failed: bool = False  # deleting orphans of earlier passes failed
    # (bytes, segments) the pass found to copy: complete segments below the last stable
    # offset not yet remote; None when it could not tell (the copy failed)
    copy_lag: tuple[int, int] | None = (0, 0)
    # [start, end) of the segments this pass committed COPY_SEGMENT_FINISHED; None when none
    # (the plan's range also holds the tail waiting for its segment to fill)
    copied: tuple[int, int] | None = None

    @property
    def name(self) -> str:
        return f"{self.plan.topic}-{self.plan.partition}"


@dataclass(slots=True)
class PassReport:
    partitions: list[PartitionSummary] = field(default_factory=list)
    copy_seconds: float = 0.0
    seconds: float = 0.0
    retention: Any = None  # pipeline.retention.RetentionReport, when that step ran
    disabled: RemoteStorageDisableResult = field(default_factory=RemoteStorageDisableResult)
    remote_logs: dict[str, RemoteLogStats] = field(default_factory=dict)  # by partition, after the pass
    error: str | None = None  # the pass stopped early: the cluster, the store or the metadata failed
    # (topic, partition): error, for partitions left out of the pass (their leader did not answer)
    unplanned: dict[tuple[str, int], str] = field(default_factory=dict)
    dry_run: bool = False  # what a pass would do (`pipeline.dry_run`); nothing was changed
    publish_error: str | None = None  # the remote log metadata could not be published into the store
    # Iceberg tables appended after the pass's commits (`pipeline.iceberg.append.TableReport`)
    tables: list[Any] = field(default_factory=list)

    @property
    def segments(self) -> int:
        return sum(p.segments for p in self.partitions)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partitions)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.copy_seconds if self.copy_seconds > 0 else 0.0

    @property
    def gaps(self) -> list[PartitionPlan]:
        return [p.plan for p in self.partitions if p.plan.gap]

    @property
    def errors(self) -> list[str]:
        errors = [f"pass: {self.error}"] if self.error else []
        errors += [f"{topic}-{partition}: not planned: {error}" for (topic, partition), error in self.unplanned.items()]
        errors += [f"{p.name}: {p.error}" for p in self.partitions if p.error]
        errors += [f"publishing remote log metadata: {self.publish_error}"] if self.publish_error else []
        failures = getattr(self.retention, "failures", None) or []
        errors += [f"{f.step} {f.partition}: {f.error}" for f in failures]
        errors += [error for _, error in self.disabled.refused]
        errors += [f"remote storage disable {tp}: {error}" for tp, error in self.disabled.failures]
        return errors + [f"iceberg {t.table}: {t.error}" for t in self.tables if t.error]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def retry_soon(self) -> bool:
        """Whether this failed pass is worth another before the interval is over: not when
        all it reports are trims stopped by damaged remote segments, which stay until they
        are repaired (a quick retry would only repeat its ERROR lines)."""
        return len(self.errors) > (getattr(self.retention, "trims_stopped", None) or 0)

    @property
    def failed_partitions(self) -> set[str] | None:
        """The partitions ("topic-partition") this pass failed; None when it failed as a whole."""
        if self.error or self.publish_error:
            return None
        failed = {p.name for p in self.partitions if p.error}
        failed |= {f"{topic}-{partition}" for topic, partition in self.unplanned}
        return failed | {f.partition for f in getattr(self.retention, "failures", None) or []}

    def publish_failed(self, error: str) -> None:
        self.publish_error = error


# ----------------------------------------------------------------------------- the Spark job


@dataclass(slots=True)
class TaskOutcome:
    """What a copy task hands back: its copy, and each wait of the copy quota (seconds)."""

    result: CopyResult
    throttle_waits: list[float] = field(default_factory=list)


def _task(raw_config: dict[str, str], max_attempts: int, accumulator: Any, quota: QuotaSettings):
    """The function Spark runs per plan. On the last allowed attempt an error is returned
    (and committed as nothing) instead of failing the whole job. `quota` is this task's
    share of the copy quota."""

    def run(plan: PartitionPlan) -> TaskOutcome:
        throttle = RateQuota(quota) if quota.enabled else None
        try:
            result = copy_task(raw_config, plan, throttle)
        except Exception as e:
            from pyspark import TaskContext

            context = TaskContext.get()
            attempt = context.attemptNumber() if context is not None else 0
            if attempt + 1 < max_attempts:
                raise  # Spark runs it again
            result = CopyResult(plan.topic, plan.partition, attempt=attempt, error=one_line(e))
        accumulator.add({f"{plan.topic}-{plan.partition}": (result.bytes_copied, len(result.segments))})
        return TaskOutcome(result, throttle.waits if throttle is not None else [])

    return run


def copy_quota_share(config: Config, spark: Any, tasks: int) -> QuotaSettings:
    """Each task's share of `remote.log.manager.copy.max.bytes.per.second`: the quota over
    the tasks that run at once, as the proxy's workers share its bounds. Spark runs each
    task in its own Python worker, so a task cannot lend its unused share to another; when
    fewer tasks than slots are left, the pass copies below the quota, never above it."""
    from .spark import task_slots

    return copy_quota_settings(config).share(min(tasks, task_slots(spark)))


def _run_copy_job(spark: Any, config: Config, plans: list[PartitionPlan], stream: TextIO,
                  on_copied: Callable[[str], None] | None = None) -> list[TaskOutcome]:
    """The copy tasks of `plans` on Spark; `on_copied("topic-partition")` as each task that
    copied a segment or more finishes, while the others still run."""
    from .progress import CopyProgress
    from .spark import max_task_attempts, run_job

    group = f"tierproxy-tier-{uuid.uuid4().hex[:8]}"
    progress = CopyProgress(spark, group, len(plans), stream=stream)
    task = _task(config.raw(), max_task_attempts(spark), progress.accumulator,
                 copy_quota_share(config, spark, len(plans)))

    def poll(final: bool) -> None:
        copied = progress.poll(final=final)
        if on_copied is not None:
            for partition in copied:
                on_copied(partition)

    return run_job(spark, group, f"tierproxy tier: copy {len(plans)} partition(s)", plans, task, poll)


# ----------------------------------------------------------------------------- one pass


def _retention_step():
    """`tierproxy.pipeline.retention.run_retention`, if that module is installed."""
    if importlib.util.find_spec("tierproxy.pipeline.retention") is None:
        return None
    from .retention import run_retention

    return run_retention


async def _pass(config: Config, spark: Any, stream: TextIO, report: PassReport, *, retention: bool,
                dry_run: bool = False, on_copied: Callable[[str], None] | None = None) -> None:
    """Fills `report` as it goes, so that what was done is reported when a step fails."""
    if config[REMOTE_LOG_METADATA_BACKEND] == "remote":
        raise ConfigError("remote.log.metadata.backend=remote is read-only: the pipeline keeps the metadata in "
                          "its `file` or `topic` store and publishes it into the remote store itself")
    # After the pass's last commit, even one that stopped it: the bucket is never ahead of the store.
    async with Cluster.from_config(config) as cluster, remote_storage_manager(config) as rsm, \
            metadata_manager(config) as rlmm, publishing_metadata(
                rlmm, rsm, report.publish_failed, skip=dry_run,
                topic_partitions=lambda: tiered_partition_counts(config, cluster)):
        plans = await plan_pass(config, cluster, rlmm, unplanned=report.unplanned)
        summaries = {(p.topic, p.partition): PartitionSummary(p) for p in plans}
        report.partitions = list(summaries.values())
        if dry_run:
            await dry_pass(config, cluster, rlmm, rsm, report, plans, retention=retention)
            return
        # A partition with something to copy has its orphans cleaned by its commit, after
        # the copy: with the store down, what its summary names first is the failed upload.
        for p in plans:
            if not p.empty:
                continue
            summary = summaries[(p.topic, p.partition)]
            try:
                summary.cleaned += len(await clean_orphans(rlmm, rsm, p.topic_id_partition, p.leader_epoch))
            except (RemoteStorageError, RemoteLogMetadataError) as e:
                # The orphans stay (never served) for the next pass.
                error = log_failure(log, logging.ERROR, f"{summary.name}: orphan cleanup", e)
                summary.error = f"orphan cleanup failed: {error}"
                summary.cleanup_failed, summary.copy_lag = True, None

        to_copy = [p for p in plans if not p.empty]
        if to_copy:
            print(f"[tier] copying {len(to_copy)} of {len(plans)} partition(s): "
                  + ", ".join(str(p) for p in to_copy), file=stream, flush=True)
            copy_started = time.monotonic()
            outcomes = await asyncio.to_thread(_run_copy_job, spark, config, to_copy, stream, on_copied)
            report.copy_seconds = time.monotonic() - copy_started
            by_partition = {(o.result.topic, o.result.partition): o for o in outcomes}
            for p in to_copy:
                summary = summaries[(p.topic, p.partition)]
                outcome = by_partition[(p.topic, p.partition)]
                result = outcome.result
                summary.throttle_waits = outcome.throttle_waits
                commit = await commit_partition(rlmm, rsm, p, [] if result.error else result.metadata())
                _record(summary, result, commit, result.error)

        run_retention = _retention_step() if retention else None
        if run_retention is not None:
            report.retention = await run_retention(config, cluster, rlmm, rsm, now_ms=int(time.time() * 1000))
        if retention:
            try:
                report.disabled = await apply_remote_storage_disable(config, cluster, rlmm, rsm)
            except Exception as e:
                report.disabled.failures.append(("*", log_failure(log, logging.WARNING, "remote storage disable", e)))

        await rlmm.refresh()
        now_ms = int(time.time() * 1000)
        report.remote_logs = {
            f"{p.topic}-{p.partition}": remote_log_stats(rlmm.list_segments(p.topic_id_partition),
                                                        config.topic(p.topic), now_ms)
            for p in plans
        }


def _record(summary: PartitionSummary, result: CopyResult, commit: CommitResult, error: str | None) -> None:
    summary.segments = len(commit.committed)
    if commit.committed:
        summary.copied = (commit.committed[0].start_offset, commit.committed[-1].end_offset + 1)
    summary.bytes = commit.bytes_committed
    summary.pending_bytes = result.pending_bytes
    summary.cleaned += len(commit.cleaned)
    # The copy's own failure first; the commit's (its orphan cleanup, say) after it.
    summary.error = "; ".join(e for e in (error and f"copy failed: {error}", commit.error) if e) or None
    summary.uploaded = len(result.segments)
    summary.cleanup_failed = commit.cleanup_failed
    summary.copy_failed = summary.error is not None
    summary.copy_lag = None if error else (result.bytes_copied, len(result.segments))


def run_pass(config: Config, spark: Any, *, stream: TextIO | None = None, retention: bool = True,
             summary: bool = True, output: TextIO | None = None, as_json: bool = False,
             dry_run: bool = False, on_copied: Callable[[str], None] | None = None) -> PassReport:
    """One pass under the pipeline's lock. Progress goes to `stream` (stderr), the summary
    to `output` (stdout): a table, or with `as_json` one JSON document on one line. A
    failure of the cluster, the store or the metadata ends the pass with its report
    (`error` set), never an exception; only PipelineBusy is raised. With `dry_run` the
    report says what a pass would do, and nothing is changed (nor the lock taken).
    `on_copied` is called with each partition whose copy task copied something, as it ends."""
    stream = stream if stream is not None else sys.stderr
    report = PassReport(dry_run=dry_run)
    started = time.monotonic()
    with contextlib.nullcontext() if dry_run else pipeline_lock(config):
        try:
            asyncio.run(_pass(config, spark, stream, report, retention=retention, dry_run=dry_run,
                              on_copied=on_copied))
        except Exception as e:
            report.error = log_failure(log, logging.ERROR, "tiering pass", e)
        if not dry_run:
            # After the pass's commits, from the remote segments alone: a failure here is
            # reported and undoes nothing of the pass.
            report.tables = _table_step(config, spark, stream)
    report.seconds = time.monotonic() - started
    if summary:
        text = json.dumps(summary_json(report), separators=(",", ":")) if as_json else format_summary(report)
        print(text, file=output if output is not None else sys.stdout, flush=True)
    return report


def _table_step(config: Config, spark: Any, stream: TextIO) -> list[Any]:
    """The Iceberg tables of the topics that have one (`pipeline.iceberg`)."""
    from .iceberg.settings import enabled_topics

    if not enabled_topics(config):
        return []
    from .iceberg.append import append_tables

    return append_tables(config, spark, stream=stream)


# ----------------------------------------------------------------------------- summary


def format_summary(report: PassReport) -> str:
    trimmed = {str(t.topic_id_partition): t for t in getattr(report.retention, "trimmed", None) or []}
    expired = {str(e.topic_id_partition): e for e in getattr(report.retention, "expired", None) or []}
    header = ("partition", "copied range", "segments", "MB", "waiting MB", "orphans", "trimmed to", "expired", "note")
    rows = []
    for p in report.partitions:
        t, e = trimmed.get(p.name), expired.get(p.name)
        note = "GAP: data lost before tiering" if p.plan.gap else "copy disabled" if p.plan.copy_disabled else ""
        if p.error:
            note = (note + "; " if note else "") + f"ERROR {p.error}"
        copied = f"[{p.copied[0]}, {p.copied[1]})" if p.copied else "-"
        rows.append((
            p.name, copied, str(p.segments), f"{p.bytes / MB:.1f}", f"{p.pending_bytes / MB:.1f}", str(p.cleaned),
            str(t.new_log_start_offset) if t else "-", str(e.segments) if e and e.segments else "-", note,
        ))
    lines = text_table([header, *rows])
    n_trimmed, n_expired = len(trimmed), sum(e.segments for e in expired.values())
    lines.append(
        f"{len(report.partitions)} partitions, {report.segments} segments, {report.bytes / MB:.1f} MB in "
        f"{report.copy_seconds:.1f}s ({report.mb_per_s:.1f} MB/s), {n_trimmed} partitions trimmed, "
        f"{n_expired} segments expired; pass took {report.seconds:.1f}s")
    removed = getattr(report.retention, "removed", None) or []
    if removed:
        lines.append(f"removed partitions of deleted topics: {', '.join(str(r.topic_id_partition) for r in removed)}")
    if report.disabled.removed:
        lines.append("remote data deleted, remote storage turned off (remote.log.delete.on.disable): "
                     + ", ".join(f"{r.topic_id_partition} ({r.segments} segments)" for r in report.disabled.removed))
    if report.tables:
        from .iceberg.append import format_reports

        lines += format_reports(report.tables)
    for error in report.errors:
        lines.append(f"ERROR {error}")
    if report.dry_run:
        lines.append("dry run: what a pass would copy, trim to and expire; nothing was changed")
    return "\n".join(lines)


def summary_json(report: PassReport) -> dict[str, Any]:
    """The summary as data: what `tierproxy tier --json` prints, one document per pass."""
    trimmed = {str(t.topic_id_partition): t for t in getattr(report.retention, "trimmed", None) or []}
    expired = {str(e.topic_id_partition): e for e in getattr(report.retention, "expired", None) or []}
    partitions = []
    for p in report.partitions:
        t, e = trimmed.get(p.name), expired.get(p.name)
        partitions.append({
            "topic": p.plan.topic, "partition": p.plan.partition,
            "copied_range": list(p.copied) if p.copied else None,
            "planned_range": None if p.plan.empty else [p.plan.start_offset, p.plan.end_offset],
            "segments": p.segments, "bytes": p.bytes, "waiting_bytes": p.pending_bytes, "orphans_cleaned": p.cleaned,
            "trimmed_to": t.new_log_start_offset if t else None, "expired_segments": e.segments if e else 0,
            "gap": p.plan.gap, "copy_disabled": p.plan.copy_disabled, "error": p.error,
        })
    removed = getattr(report.retention, "removed", None) or []
    return {
        "ok": report.ok, "dry_run": report.dry_run, "seconds": round(report.seconds, 3), "copy_seconds": round(report.copy_seconds, 3),
        "segments": report.segments, "bytes": report.bytes, "partitions": partitions,
        "removed_partitions": [str(r.topic_id_partition) for r in removed],
        "remote_storage_disabled": [str(r.topic_id_partition) for r in report.disabled.removed],
        "iceberg_tables": [{
            "table": t.table, "rows": t.rows, "segments": t.segments, "files": t.files, "bytes": t.bytes,
            "added": {str(p): list(r) for p, r in sorted(t.added.items())},
            "gaps": {str(p): list(r) for p, r in sorted(t.gaps.items())}, "error": t.error,
        } for t in report.tables],
        "errors": report.errors,
    }


# ----------------------------------------------------------------------------- --every


def run_every(config: Config, spark: Any, interval_ms: int, *, stream: TextIO | None = None,
              stop: threading.Event | None = None, max_passes: int | None = None, output: TextIO | None = None,
              as_json: bool = False, metrics: PipelineMetrics | None = None) -> int:
    """Passes until SIGINT/SIGTERM (or `stop`, or `max_passes`); returns how many failed in a row at the end."""
    stop = stop or threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda *_: _stop(stop))
    failures = passes = 0
    backoff = ExponentialBackoff.from_config(config)
    failed: set[str] | None = set()  # partitions the last pass failed; None: all of them

    def copied(partition: str) -> None:
        # A partition the last pass failed copies again: what failed it (the store, say) is back.
        if metrics is not None and (failed is None or partition in failed):
            metrics.recovered()

    try:
        while not stop.is_set():
            passes += 1
            started = time.monotonic()
            retry_soon = True
            try:
                report = run_pass(config, spark, stream=stream, output=output, as_json=as_json, on_copied=copied)
                failures = 0 if report.ok else failures + 1
                retry_soon = report.retry_soon
                failed = report.failed_partitions
                if metrics is not None:
                    metrics.record(report)
            except Exception as e:
                failures += 1
                failed = None
                if metrics is not None:
                    metrics.pass_failed(time.monotonic() - started)
                # Expected failures (busy, a lock file that cannot be made) are one line;
                # anything else gets its traceback.
                log.error("tiering pass failed: %s", e, exc_info=not isinstance(e, (PipelineBusy, OSError)))
            if max_passes is not None and passes >= max_passes:
                break
            # A failure a retry may mend (the store, the cluster) is retried with the backoff.
            wait_ms = min(interval_ms, backoff.backoff_ms(failures - 1)) if failures and retry_soon else interval_ms
            stop.wait(wait_ms / 1000)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return failures


def _stop(stop: threading.Event) -> None:
    log.warning("stopping after the current pass")
    stop.set()
