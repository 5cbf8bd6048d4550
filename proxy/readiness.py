"""Whether the proxy is ready for clients, as `/ready` on the metrics endpoint answers: its
listeners accept connections and a bootstrap broker answered ApiVersions lately.

The broker is asked on the proxy's own timer (CHECK_INTERVAL_S), never per probe: a probe
reads what the last check found, from the metrics endpoint's thread, and so never waits on
the event loop. A check that has not come back for STALE_S (a stuck event loop, a broker
that takes every connection and answers nothing) counts as a failed one. With
`proxy.workers` > 1 each worker writes its state to a file in the supervisor's metrics
directory, and the supervisor's endpoint is ready when every worker is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

__all__ = ("CHECK_INTERVAL_S", "STALE_S", "Readiness", "workers_reason")

CHECK_INTERVAL_S = 10.0
STALE_S = 3 * CHECK_INTERVAL_S


class Readiness:
    """The proxy's state for `/ready`: `reason()` is None when ready, else one line why not."""

    def __init__(self, report_dir: str | None = None) -> None:
        self._listeners: str | None = "the listeners are not open yet"
        self._broker: str | None = "no broker checked yet"
        self._answered_at = time.monotonic()
        self._report = _report_path(report_dir, os.getpid()) if report_dir else None

    def listening(self) -> None:
        self._listeners = None
        self._write()

    def closing(self) -> None:
        self._listeners = "the proxy is shutting down"
        self._write()

    def broker_checked(self, failure: str | None) -> None:
        """The outcome of one check: None when a broker answered, else why none did."""
        self._broker = failure
        if failure is None:
            self._answered_at = time.monotonic()
        self._write()

    def reason(self) -> str | None:
        if self._listeners is not None:
            return self._listeners
        if self._broker is not None:
            return self._broker
        silent = time.monotonic() - self._answered_at
        if silent > STALE_S:
            return f"no broker check has succeeded for {silent:.0f} s"
        return None

    def _write(self) -> None:
        """The worker's state for the supervisor: empty when ready (the file's age tells
        how fresh it is). Written whole, then renamed, so a reader never sees half."""
        if self._report is None:
            return
        temporary = f"{self._report}.tmp"
        with open(temporary, "w") as file:
            file.write(self.reason() or "")
        os.replace(temporary, self._report)


def workers_reason(report_dir: str, pids: Sequence[int | None]) -> str | None:
    """The supervisor's `/ready`: None when every worker reported ready lately."""
    for index, pid in enumerate(pids):
        path = _report_path(report_dir, pid) if pid is not None else None
        try:
            if path is None:
                raise FileNotFoundError
            age = time.time() - os.stat(path).st_mtime
            with open(path) as file:
                reason = file.read().strip()
        except FileNotFoundError:
            return f"worker {index} has not started"
        if reason:
            return f"worker {index}: {reason}"
        if age > STALE_S:
            return f"worker {index} has not reported for {age:.0f} s"
    return None


def _report_path(report_dir: str, pid: int) -> str:
    # Not *.db: prometheus-client's MultiProcessCollector reads those in the same directory.
    return os.path.join(report_dir, f"ready_{pid}.txt")
