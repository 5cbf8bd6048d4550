"""A TCP relay that holds back the first byte of every response, standing for an object
store's first-byte latency (10-50 ms for S3 GETs) in front of a fast local one.

A "response" starts when the server sends after the client did: on a keep-alive HTTP
connection that is each answer to a request. Its first bytes wait `first_byte_ms`; the
rest streams as fast as the server sends it. The bytes never enter Python: each direction
of a connection is a thread moving them socket -> pipe -> socket with splice(2), so the
relay costs little CPU beside the processes under measurement (its own CPU time is
reported by the benchmarks all the same). Run it as its own process:

    python -m testbed.latency --listen 9000 --to 127.0.0.1:9001 --first-byte-ms 20
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from testbed.ports import LOOPBACK, free_port
from testbed.processes import spawn, stop_pids

# Bytes one splice moves at most: the pipe is grown to this, so a call drains a socket's
# receive buffer in one go.
SPLICE_BYTES = 1 << 20


def _pipe() -> tuple[int, int]:
    read_end, write_end = os.pipe()
    with contextlib.suppress(OSError):  # only the pipe's capacity: the default 64 KiB works too
        import fcntl

        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, SPLICE_BYTES)
    return read_end, write_end


def _pump(source: socket.socket, sink: socket.socket, asked: threading.Event, delay_s: float,
          sets_asked: bool) -> None:
    """Move bytes from `source` to `sink` until `source` ends. The upstream direction marks a
    request (`sets_asked`); the downstream one waits `delay_s` before the first byte of the
    answer to each."""
    read_end, write_end = _pipe()
    poller = select.poll()
    poller.register(source, select.POLLIN)
    try:
        while True:
            poller.poll()
            if sets_asked:
                asked.set()
            elif asked.is_set():
                asked.clear()
                time.sleep(delay_s)
            moved = os.splice(source.fileno(), write_end, SPLICE_BYTES)
            if moved == 0:
                break
            while moved:
                moved -= os.splice(read_end, sink.fileno(), moved)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
    finally:
        os.close(read_end)
        os.close(write_end)


def _serve_connection(client: socket.socket, target: tuple[str, int], delay_s: float) -> None:
    try:
        server = socket.create_connection(target)
    except OSError:
        client.close()
        return
    for sock in (client, server):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    asked = threading.Event()  # the client sent something the server has not answered yet
    up = threading.Thread(target=_pump, args=(client, server, asked, delay_s, True), daemon=True)
    up.start()
    _pump(server, client, asked, delay_s, False)
    up.join()
    client.close()
    server.close()


def _relay(listen: int, target: tuple[str, int], delay_s: float) -> None:
    listener = socket.create_server((LOOPBACK, listen), reuse_port=False)
    stop = threading.Event()

    def stopping(*_: object) -> None:
        stop.set()
        listener.close()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stopping)
    while not stop.is_set():
        try:
            client, _ = listener.accept()
        except OSError:
            break
        threading.Thread(target=_serve_connection, args=(client, target, delay_s), daemon=True).start()


class LatencyRelay:
    """`python -m testbed.latency` as a subprocess in front of `target`."""

    def __init__(self, target_url: str, first_byte_ms: float, workdir: Path) -> None:
        host, port = target_url.rsplit("/", 1)[-1].rsplit(":", 1)
        self.target = (host, int(port))
        self.first_byte_ms = first_byte_ms
        self.port = free_port()
        self._log = workdir / "latency-relay.log"
        self._process: subprocess.Popen | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int:
        """The relay's process (its CPU is measured beside the proxy's)."""
        if self._process is None:
            raise RuntimeError("the latency relay is not running")
        return self._process.pid

    def __enter__(self) -> LatencyRelay:
        self._log.parent.mkdir(parents=True, exist_ok=True)
        self._process = spawn([sys.executable, "-m", "testbed.latency", "--listen", str(self.port), "--to",
                               f"{self.target[0]}:{self.target[1]}", "--first-byte-ms", str(self.first_byte_ms)],
                              self._log, cwd=Path(__file__).resolve().parent.parent)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((LOOPBACK, self.port), 0.5).close()
                return self
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the latency relay did not listen on {self.port}: {self._log.read_text()}")
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            stop_pids([self._process.pid])
            self._process = None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--to", required=True, metavar="HOST:PORT")
    parser.add_argument("--first-byte-ms", type=float, default=20.0)
    args = parser.parse_args()
    host, port = args.to.rsplit(":", 1)
    _relay(args.listen, (host, int(port)), args.first_byte_ms / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
