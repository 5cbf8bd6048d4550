"""Start server processes with their output in a file, and stop them by pid."""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Self, Sequence

from testbed.ports import free_port

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


class ServerProcess:
    """A server in a process of its own on a loopback port, its files and its log in a working
    directory (a temporary one unless given; ``close()`` removes that), stopped by pid.

    A subclass gives ``name``, ``_command(workdir, port)`` and ``answers()`` (the server serves),
    and may give ``_environment()``. ``detached`` servers outlive this Python process
    (``python -m testbed up``); attached ones are stopped at exit.
    """

    name = "server"
    start_timeout_s = 30.0
    start_error: type[Exception] = RuntimeError

    def __init__(self, *, port: int | None = None, workdir: Path | None = None, detached: bool = False) -> None:
        self._port = port
        self._given_workdir = Path(workdir) if workdir is not None else None
        self._workdir: Path | None = self._given_workdir
        self._detached = detached
        self._process: subprocess.Popen | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._port

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._workdir

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def _command(self, workdir: Path, port: int) -> list[str]:
        raise NotImplementedError

    def _environment(self) -> Mapping[str, str] | None:
        return None  # this process's own

    def answers(self) -> bool:
        raise NotImplementedError

    def start(self) -> Self:
        self._launch(f"tierproxy-{self.name}-")
        return self

    def restart(self) -> Self:
        self.stop()
        return self.start()

    def _launch(self, workdir_prefix: str) -> None:
        """Start the process and wait until it answers; stopped again if it does not."""
        if self._process is not None:
            raise RuntimeError(f"{self.name} already started")
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix=workdir_prefix))
        self._workdir.mkdir(parents=True, exist_ok=True)
        if self._port is None:
            self._port = free_port()
        if not self._detached:
            atexit.register(self._stop_at_exit)
        self._process = spawn(self._command(self._workdir, self._port), self.log_path, detached=self._detached,
                              env=self._environment(), cwd=self._workdir)
        try:
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise

    def _wait_until_serving(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.start_timeout_s
        while not self.answers():
            if self._process.poll() is not None:
                raise self.start_error(f"{self.name} exited with {self._process.returncode}:\n"
                                       f"{log_tail(self.log_path)}")
            if time.monotonic() > deadline:
                raise self.start_error(f"{self.name} did not answer on port {self._port} within "
                                       f"{self.start_timeout_s:.0f} s:\n{log_tail(self.log_path)}")
            time.sleep(0.1)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop by pid; the port and the working directory stay for a restart."""
        atexit.unregister(self._stop_at_exit)
        process, self._process = self._process, None
        if process is not None:
            try:
                stop_pids([process.pid], timeout=timeout)
            finally:
                process.poll()

    def close(self) -> None:
        """Stop and remove the working directory (if it was a temporary one)."""
        self.stop()
        if self._given_workdir is None and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def _stop_at_exit(self) -> None:
        try:
            self.stop(timeout=3.0)
        except Exception:  # noqa: BLE001 - interpreter is exiting
            pass

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
