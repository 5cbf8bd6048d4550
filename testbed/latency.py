"""A TCP relay that holds back the first byte of every response, standing for an object
store's first-byte latency (10-50 ms for S3 GETs) in front of a fast local one.

A "response" starts when the server sends after the client did: on a keep-alive HTTP
connection that is each answer to a request. Its first bytes wait `first_byte_ms`; the
rest streams as fast as the server sends it. Run it as its own process, so that it
costs the process under measurement nothing:

    python -m testbed.latency --listen 9000 --to 127.0.0.1:9001 --first-byte-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed.ports import LOOPBACK, free_port
from testbed.processes import spawn, stop_pids

CHUNK = 256 * 1024


async def _relay(listen: int, target: tuple[str, int], delay_s: float) -> None:
    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        asked = asyncio.Event()  # the client sent something the server has not answered yet

        async def upstream() -> None:
            while data := await client_reader.read(CHUNK):
                asked.set()
                server_writer.write(data)
                await server_writer.drain()
            server_writer.write_eof()

        async def downstream() -> None:
            while data := await server_reader.read(CHUNK):
                if asked.is_set():
                    asked.clear()
                    await asyncio.sleep(delay_s)
                client_writer.write(data)
                await client_writer.drain()
            client_writer.close()

        with contextlib.suppress(OSError):
            await asyncio.gather(upstream(), downstream())
        for writer in (client_writer, server_writer):
            writer.close()

    server = await asyncio.start_server(handle, LOOPBACK, listen)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


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

    def __enter__(self) -> LatencyRelay:
        self._log.parent.mkdir(parents=True, exist_ok=True)
        self._process = spawn([sys.executable, "-m", "testbed.latency", "--listen", str(self.port), "--to",
                               f"{self.target[0]}:{self.target[1]}", "--first-byte-ms", str(self.first_byte_ms)],
                              self._log, cwd=Path(__file__).resolve().parent.parent)
        import socket

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
    asyncio.run(_relay(args.listen, (host, int(port)), args.first_byte_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
