"""The floor of serving remote bytes from Python: what a process that does nothing else costs.

A sender process preads the given files (page-cached remote `.log` segments) into one
reused 1 MiB buffer and sends every byte over a loopback TCP connection to a receiver
process that reads and drops them; the sender's CPU seconds per GB is the floor a proxy
replaying the same bytes from local files can be compared with (`benchmarks/backfill.py`
measures it in the same run as the replays). With `--memory`, the sender sends from one
buffer already in memory: the floor of a warm replay, whose chunks are cached.

With `--tls`, the floor of reading an object store over HTTPS: a sender process serves the
files over a loopback TLS 1.3 connection (AES-GCM, as S3 and S3Proxy negotiate), and this
process decrypts them with `recv_into` into one reused buffer; its CPU seconds per GB are
what the proxy's reads of case (t) are compared with.

    .venv/bin/python benchmarks/floor.py FILE [FILE ...] [--repeats 3] [--memory | --tls]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import ssl
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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


def _send_tls(listener: socket.socket, context: ssl.SSLContext, files: list[Path]) -> None:
    connection, _ = listener.accept()
    with context.wrap_socket(connection, server_side=True) as tls:
        buffer = bytearray(BUFFER_BYTES)
        view = memoryview(buffer)
        for path in files:
            with open(path, "rb", buffering=0) as f:
                while n := f.readinto(view):
                    tls.sendall(view[:n])
        tls.recv(1)  # the receiver closes once it has every byte


def receive_tls(files: list[Path]) -> tuple[float, int, str]:
    """(receiver CPU seconds, bytes received, cipher): every file once, sent over loopback
    TLS 1.3 by a sender process and decrypted here into one reused buffer."""
    from testbed.tls import write_tls_files

    with tempfile.TemporaryDirectory(prefix="tls-floor-") as directory:
        tls = write_tls_files(Path(directory))
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.minimum_version = ssl.TLSVersion.TLSv1_3
        server.load_cert_chain(tls.broker_cert, tls.broker_key)
        client = ssl.create_default_context(cafile=str(tls.ca))
        client.minimum_version = ssl.TLSVersion.TLSv1_3
    listener = socket.create_server(("127.0.0.1", 0))
    sender = multiprocessing.get_context("fork").Process(target=_send_tls, args=(listener, server, files),
                                                         daemon=True)
    sender.start()
    buffer = bytearray(BUFFER_BYTES)
    view = memoryview(buffer)
    received, total = 0, sum(f.stat().st_size for f in files)
    connection = socket.create_connection(listener.getsockname())
    with client.wrap_socket(connection, server_hostname="127.0.0.1") as tls_socket:
        cipher = tls_socket.cipher()
        started = _cpu_seconds()  # after the handshake: the bytes, as a kept-alive connection reads them
        while received < total and (n := tls_socket.recv_into(view)):
            received += n
        cpu = _cpu_seconds() - started
    sender.join()
    listener.close()
    return cpu, received, cipher[0] if cipher else "?"


def tls_floor_seconds_per_gb(files: list[Path], repeats: int = 3) -> list[float]:
    """Receiver CPU s/GB of each of `repeats` passes over the files, over TLS."""
    out = []
    for _ in range(repeats):
        cpu, received, _ = receive_tls(files)
        out.append(cpu / (received / 1e9))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="send from memory (the warm floor)")
    parser.add_argument("--tls", action="store_true", help="receive over TLS 1.3 (the floor of reads over HTTPS)")
    args = parser.parse_args()
    if args.tls:
        print(f"TLS cipher: {receive_tls(args.files[:1])[2]}")
    values = (tls_floor_seconds_per_gb(args.files, args.repeats) if args.tls
              else floor_seconds_per_gb(args.files, args.repeats, memory=args.memory))
    print(f"floor CPU s/GB: best {min(values):.3f}, median {statistics.median(values):.3f} "
          f"({', '.join(f'{v:.3f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
