"""Free TCP ports on the loopback interface, chosen at run time, and the TCP sockets the
kernel lists (/proc/net/tcp and tcp6), for checks of what a server holds."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_ports(count: int) -> list[int]:
    """Ports the kernel handed out for binding port 0, released before returning.

    All sockets stay open until every port is picked, so one call never returns
    the same port twice. Another process may still grab a port before our
    server binds it; the servers we start fail loudly in that case.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    return free_ports(1)[0]


ESTABLISHED = "01"
LISTEN = "0A"


@dataclasses.dataclass(frozen=True)
class TcpSocket:
    """One row of /proc/net/tcp or tcp6."""

    local_address: str  # hex, as the kernel writes it (127.0.0.1 is 0100007F)
    local_port: int
    remote_port: int
    state: str  # hex: ESTABLISHED, LISTEN, ...
    tx_queue: int  # bytes sent and not acknowledged, or not sent yet
    rx_queue: int  # bytes received and not read by the process
    inode: str


def tcp_sockets() -> Iterator[TcpSocket]:
    """Every IPv4 and IPv6 TCP socket of this machine's network namespace."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_address, local_port = fields[1].rsplit(":", 1)
            tx_queue, rx_queue = fields[4].split(":")
            yield TcpSocket(local_address, int(local_port, 16), int(fields[2].rsplit(":", 1)[1], 16), fields[3],
                            int(tx_queue, 16), int(rx_queue, 16), fields[9])
