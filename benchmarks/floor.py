"""The floor of serving remote bytes from Python: what a process that does nothing else costs.

A sender process preads the given files (page-cached remote `.log` segments) into one
reused 1 MiB buffer and sends every byte over a loopback TCP connection to a receiver
process that reads and drops them; the sender's CPU seconds per GB is the floor a proxy
replaying the same bytes from local files can be compared with (`benchmarks/backfill.py`
measures it in the same run as the replays). With `--memory`, the sender sends from one
buffer already in memory: the floor of a warm replay, whose chunks are cached.

    .venv/bin/python benchmarks/floor.py FILE [FILE ...] [--repeats 3] [--memory]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import sys
from pathlib import Path

BUFFER_BYTES = 1 << 20


def _cpu_seconds() -> float:
    usage = os.times()
    return usage.user + usage.system


def _receive(listener: socket.socket) -> None:
    connection, _ = listener.accept()
    with connection:
        buffer = bytearray(BUFFER_BYTES)
        while connection.recv_into(buffer):
            pass


def send_files(files: list[Path], *, memory: bool = False) -> tuple[float, int]:
    """(sender CPU seconds, bytes sent): every file once, read into one reused buffer (or,
    with `memory`, the same bytes sent from memory, as a cached chunk would be)."""
    listener = socket.create_server(("127.0.0.1", 0))
    receiver = multiprocessing.get_context("fork").Process(target=_receive, args=(listener,), daemon=True)
    receiver.start()
    sender = socket.create_connection(listener.getsockname())
    sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray(BUFFER_BYTES)
    view = memoryview(buffer)
    sizes = [f.stat().st_size for f in files]
    in_memory = memoryview(files[0].read_bytes()[:BUFFER_BYTES]) if memory else None
    started = _cpu_seconds()  # this process only: the receiver is a child of its own
    sent = 0
    for path, size in zip(files, sizes):
        fd = os.open(path, os.O_RDONLY)
        try:
            position = 0
            while position < size:
                if in_memory is not None:
                    n = min(len(in_memory), size - position)
                    sender.sendall(in_memory[:n])
                else:
                    n = os.preadv(fd, [view], position)
                    if n <= 0:
                        break
                    sender.sendall(view[:n])
                position += n
                sent += n
        finally:
            os.close(fd)
    sender.close()
    receiver.join()
    listener.close()
    return _cpu_seconds() - started, sent


def floor_seconds_per_gb(files: list[Path], repeats: int = 3, *, memory: bool = False) -> list[float]:
    """Sender CPU s/GB of each of `repeats` passes over the files."""
    out = []
    for _ in range(repeats):
        cpu, sent = send_files(files, memory=memory)
        out.append(cpu / (sent / 1e9))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="send from memory (the warm floor)")
    args = parser.parse_args()
    values = floor_seconds_per_gb(args.files, args.repeats, memory=args.memory)
    print(f"floor CPU s/GB: best {min(values):.3f}, median {statistics.median(values):.3f} "
          f"({', '.join(f'{v:.3f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
