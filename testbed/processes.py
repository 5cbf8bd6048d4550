"""Start server processes with their output in a file, and stop them by pid."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

_PR_SET_PDEATHSIG = 1


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec_fn that makes Linux SIGKILL the child when its parent thread exits.

    So a test run killed outright (no atexit) leaves no server behind. libc is
    looked up here, before fork: the child of a threaded process must not
    dlopen (a lock held by another thread at fork time would never be released).
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    sig = int(signal.SIGKILL)

    def set_pdeathsig() -> None:
        prctl(_PR_SET_PDEATHSIG, sig)

    return set_pdeathsig


def spawn(
    args: Sequence[str],
    log_path: Path,
    *,
    detached: bool = False,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen:
    """Start ``args`` with stdout and stderr appended to ``log_path``.

    ``detached`` processes are detached from our process group and outlive this Python
    process (the ``python -m testbed up`` case). Attached ones die with the
    thread that started them, which must then be the main thread: a worker
    thread may exit long before the tests are done with the server.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    die_with_parent = not detached and threading.current_thread() is threading.main_thread()
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_parent_death_signal() if die_with_parent else None,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The state follows the parenthesised command name, which may hold spaces.
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in (b"Z", b"X")


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except (FileNotFoundError, ProcessLookupError):
        return []


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: its parent (or init) reaps it


def stop_pids(pids: Sequence[int], *, timeout: float = 15.0) -> None:
    """SIGTERM every pid at once, wait up to ``timeout``, then SIGKILL the rest.

    All at once because KRaft nodes in combined mode wait for the controller
    quorum during a controlled shutdown: stopping them one after the other makes
    the last ones wait for a quorum that is already gone.
    """
    _signal_all(pids, signal.SIGTERM)
    remaining = _wait_gone(list(pids), timeout)
    if remaining:
        _signal_all(remaining, signal.SIGKILL)
        remaining = _wait_gone(remaining, 5.0)
    if remaining:
        raise RuntimeError(f"processes {remaining} still run after SIGKILL")


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after waiting up to `timeout` seconds (reaping children)."""
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        for pid in pids:
            _reap(pid)
        pids = [pid for pid in pids if is_alive(pid)]
        if pids:
            time.sleep(0.05)
    return pids


def _signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no {path})"
    return "\n".join(text.splitlines()[-lines:])


def pids_running(substring: str) -> list[int]:
    """Live processes whose command line mentions ``substring`` (a workdir, a port)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and is_alive(int(entry.name)):
            if any(substring in part for part in cmdline(int(entry.name))):
                found.append(int(entry.name))
    return found
