"""Free TCP ports on the loopback interface, chosen at run time."""

from __future__ import annotations

import socket

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
