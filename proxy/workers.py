"""`tierproxy serve` with several worker processes: the supervisor.

Every worker is a whole proxy (`tierproxy serve --worker-index I`) that opens the same
listeners with SO_REUSEPORT, so the kernel spreads new client connections among them;
a connection stays with the worker that accepted it, as a channel stays with one broker
network thread. Each worker gets its share of the whole proxy's bounds (`shares`), so
the memory formula in docs/operations.md holds for the sum; the remote fetch quota is one
rate that all of them share, in a file the supervisor creates (storage/shared_quota.py).
The supervisor does not serve clients: it starts the workers, restarts one that dies,
serves the Prometheus endpoint for all of them (prometheus-client's multiprocess mode;
`/ready` when every worker is, see proxy.readiness) and, on SIGTERM or SIGINT, stops them
and exits.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from wsgiref.simple_server import WSGIServer

from tierproxy.config import (
    Config,
    METRICS_PORT,
    PROXY_BOOTSTRAP_PORT,
    PROXY_LISTENER_HOST,
    PROXY_WORKERS,
    UNLIMITED_BYTES_PER_SECOND,
    REMOTE_LOG_INDEX_CACHE_DIR,
    REMOTE_LOG_INDEX_FILE_CACHE_TOTAL_SIZE_BYTES,
)

from .readiness import workers_reason

__all__ = ("WORKER_CANNOT_START", "shares", "supervise", "watch_supervisor", "worker_count")

log = logging.getLogger("tierproxy")

# A worker's exit status when it cannot start (bad configuration, a port taken): the
# supervisor then stops everything instead of restarting it (sysexits' EX_CONFIG).
WORKER_CANNOT_START = 78

# A worker restarted this often within this window is crash-looping: give up.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
STOP_TIMEOUT_S = 30.0
# A worker whose supervisor is gone stops as on SIGTERM; one still there this long after
# (a read stuck in the store holds its shutdown) exits at once: nobody is left to kill it.
ORPHAN_STOP_TIMEOUT_S = 5.0
SUPERVISOR_CHECK_INTERVAL_S = 0.5

# Whole-proxy bounds divided among the workers; a bound above 0 stays at least 1 each.
_DIVIDED = (
    "remote.log.index.file.cache.total.size.bytes",
    "remote.log.chunk.cache.size.bytes",
    "remote.log.reader.threads",
    "remote.log.reader.max.pending.tasks",
    "max.connections",
    "max.connections.per.ip",
    "max.connection.creation.rate",
)


def worker_count(config: Config) -> int:
    return config[PROXY_WORKERS] or os.cpu_count() or 1


def shares(config: Config, count: int) -> dict[str, str]:
    """One worker's overrides: its share of every bound the whole proxy must keep (no
    quota stays no quota)."""
    return {name: str(config[name] if config[name] == UNLIMITED_BYTES_PER_SECOND
                      else max(config[name] // count, min(config[name], 1))) for name in _DIVIDED}


def supervise(config: Config, count: int, config_arguments: Sequence[str]) -> int:
    """Run `count` workers until SIGTERM/SIGINT; the exit status of `tierproxy serve`."""
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)

    metrics_dir = tempfile.mkdtemp(prefix="tierproxy-metrics-")
    quota_file = _shared_fetch_quota(config, count)
    reserved = None
    overrides = {**shares(config, count), "proxy.workers": "1", "metrics.port": "0"}
    if config[PROXY_BOOTSTRAP_PORT] == 0:
        # Every worker must listen on the same port: pick it once and hold it (bound, not
        # listening, so it takes no connections).
        reserved = _reserve_port(config[PROXY_LISTENER_HOST])
        overrides[PROXY_BOOTSTRAP_PORT] = str(reserved.getsockname()[1])
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir}
    command = [sys.executable, "-m", "tierproxy.cli", "serve", *config_arguments,
               *(a for k, v in overrides.items() for a in ("--override", f"{k}={v}")),
               *(["--fetch-quota-file", quota_file] if quota_file else []),
               "--worker-of", str(os.getpid())]
    http = None
    workers: list[subprocess.Popen | None] = [None] * count
    restarts: list[deque[float]] = [deque() for _ in range(count)]
    status = 0
    try:
        _prune_index_directory(config)
        if config[METRICS_PORT]:
            http = _metrics_endpoint(config, metrics_dir, lambda: workers_reason(
                metrics_dir, [worker.pid if worker is not None else None for worker in workers]))
        for index in range(count):
            workers[index] = _start(command, index, env)
        log.info("tierproxy supervising %d workers (pids %s)", count, [w.pid for w in workers if w])
        while not stopping:
            time.sleep(0.2)
            for index, worker in enumerate(workers):
                if worker is None or worker.poll() is None or stopping:
                    continue
                _forget(metrics_dir, worker.pid)
                if worker.returncode == WORKER_CANNOT_START:
                    log.error("worker %d cannot start (see above); stopping", index)
                    return 1
                now = time.monotonic()
                recent = restarts[index]
                recent.append(now)
                while recent and now - recent[0] > RESTART_WINDOW_S:
                    recent.popleft()
                if len(recent) > MAX_RESTARTS:
                    log.error("worker %d died %d times within %.0f s; stopping", index, len(recent),
                              RESTART_WINDOW_S)
                    return 1
                log.warning("worker %d (pid %d) %s; restarting it", index, worker.pid,
                            _describe_exit(worker.returncode))
                workers[index] = _start(command, index, env)
        log.info("stopping %d workers", count)
    finally:
        status = max(status, _stop_all([w for w in workers if w is not None]))
        if http is not None:
            http.shutdown()
            http.server_close()
        if reserved is not None:
            reserved.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        if quota_file:
            os.unlink(quota_file)
    log.info("stopped")
    return status


def _shared_fetch_quota(config: Config, count: int) -> str | None:
    """The file of the fetch quota all the workers share (None without a quota)."""
    from tierproxy.storage.quota import fetch_quota_settings
    from tierproxy.storage.shared_quota import create

    settings = fetch_quota_settings(config)
    if not settings.enabled:
        return None
    fd, path = tempfile.mkstemp(prefix="tierproxy-fetch-quota-")
    os.close(fd)
    create(path, settings.window_num, count)
    return path


def _start(command: list[str], index: int, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([*command, "--worker-index", str(index)], env=env)


def _stop_all(workers: list[subprocess.Popen]) -> int:
    """SIGTERM every worker, SIGKILL what has not exited after STOP_TIMEOUT_S; 0 if all exited 0."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    status = 0
    for worker in workers:
        try:
            worker.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("worker pid %d did not stop within %.0f s; killing it", worker.pid, STOP_TIMEOUT_S)
            worker.kill()
            worker.wait()
        if worker.returncode not in (0, -signal.SIGTERM):
            status = 1
    return status


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def _reserve_port(host: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, 0))
    return sock


def _metrics_endpoint(config: Config, metrics_dir: str, ready: Callable[[], str | None]) -> WSGIServer:
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    from .metrics import metrics_endpoint

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=metrics_dir)
    return metrics_endpoint(config[PROXY_LISTENER_HOST], config[METRICS_PORT], registry, ready)


def _forget(metrics_dir: str, pid: int) -> None:
    """Drop a dead worker's live gauges; its counters stay in the sums."""
    from prometheus_client.multiprocess import mark_process_dead

    mark_process_dead(pid, metrics_dir)


def _prune_index_directory(config: Config) -> None:
    """The shared on-disk index cache cut to the whole proxy's bound once, before any worker
    starts (workers only add to it and remove what they evict)."""
    directory = config[REMOTE_LOG_INDEX_CACHE_DIR]
    if directory:
        from tierproxy.cache.index_cache import prune_index_directory

        prune_index_directory(directory, config[REMOTE_LOG_INDEX_FILE_CACHE_TOTAL_SIZE_BYTES])


def watch_supervisor(supervisor_pid: int) -> None:
    """In a worker: exit with the supervisor, even if it is killed with SIGKILL, whatever the
    worker is doing then (starting, serving, or stopping already, when the signal the
    supervisor's death sends changes nothing)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor_pid:  # it died before the line above
        raise SystemExit(0)
    # A thread of its own: the event loop may be stuck, or long past its signal handlers.
    threading.Thread(target=_exit_without, args=(supervisor_pid,), name="supervisor-watch", daemon=True).start()


def _exit_without(supervisor_pid: int) -> None:
    while os.getppid() == supervisor_pid:  # an orphan's parent is init or a subreaper
        time.sleep(SUPERVISOR_CHECK_INTERVAL_S)
    os.kill(os.getpid(), signal.SIGTERM)  # where there is no death signal (not Linux)
    time.sleep(ORPHAN_STOP_TIMEOUT_S)
    log.error("supervisor pid %d is gone and this worker did not stop within %.0f s; exiting", supervisor_pid,
              ORPHAN_STOP_TIMEOUT_S)
    os._exit(1)
