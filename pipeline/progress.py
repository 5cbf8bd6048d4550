"""Progress of a job of the pipeline (the copy, or an Iceberg table's append), one line at a time on stderr (no terminal control codes, so
it reads the same in a terminal, a log file or CI).

Tasks add {"topic-partition": (bytes, segments)} to an accumulator when they finish; Spark
merges those on the driver as tasks complete. The driver polls the accumulator and Spark's
status tracker (running and failed task attempts) and prints a line for every partition
that finished, plus a running total every `interval_s`.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from pyspark.accumulators import AccumulatorParam

MB = 1_000_000


class PartitionBytes(AccumulatorParam):
    """Sums {partition: (bytes, segments)} maps."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, total: dict, more: dict) -> dict:
        for key, (size, segments) in more.items():
            had = total.get(key, (0, 0))
            total[key] = (had[0] + size, had[1] + segments)
        return total


class CopyProgress:
    def __init__(self, spark, job_group: str, partitions: int, *, stream: TextIO | None = None,
                 interval_s: float = 2.0, label: str = "tier", done: str = "copied", unit: str = "partitions") -> None:
        self.sc = spark.sparkContext
        self.accumulator = self.sc.accumulator({}, PartitionBytes())
        self.job_group = job_group
        self.partitions = partitions
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        # How lines start and say what was done: "[tier ...] topic-0: 2 segment(s), 1.0 MB copied".
        self.label, self.done, self.unit = label, done, unit
        self.started = time.monotonic()
        self._reported: set[str] = set()
        self._last_total = 0.0

    def _print(self, text: str) -> None:
        print(f"[{self.label} {time.monotonic() - self.started:6.1f}s] {text}", file=self.stream, flush=True)

    def _tasks(self) -> tuple[int, int]:
        """(running, failed) task attempts of the job group."""
        tracker = self.sc.statusTracker()
        running = failed = 0
        for job_id in tracker.getJobIdsForGroup(self.job_group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    running += stage.numActiveTasks
                    failed += stage.numFailedTasks
        return running, failed

    def totals(self) -> tuple[int, int]:
        done = self.accumulator.value
        return sum(b for b, _ in done.values()), sum(s for _, s in done.values())

    def poll(self, *, final: bool = False) -> list[str]:
        """Prints what finished since the last poll; returns the partitions of it that copied
        a segment or more."""
        done = dict(self.accumulator.value)
        copied = []
        for key in sorted(set(done) - self._reported):
            size, segments = done[key]
            self._reported.add(key)
            self._print(f"{key}: {segments} segment(s), {size / MB:.1f} MB {self.done}")
            if segments:
                copied.append(key)
        now = time.monotonic()
        if final or now - self._last_total >= self.interval_s:
            self._last_total = now
            total, _ = self.totals()
            elapsed = max(now - self.started, 1e-9)
            running, failed = self._tasks() if not final else (0, 0)
            retried = f", {failed} failed attempt(s)" if failed else ""
            self._print(f"{len(done)}/{self.partitions} {self.unit} {self.done}, {running} running{retried}, "
                        f"{total / MB:.1f} MB, {total / MB / elapsed:.1f} MB/s")
        return copied
