"""Which `tierproxy serve` owns a port: one per host:port, like a broker's listener.

The workers of one `serve` share their listeners through SO_REUSEPORT, and the kernel lets
any process of the same user join such a port, so a second `serve` with the same
configuration would quietly take part of the traffic. Before anything listens, `serve`
therefore claims each of its ports with a Unix socket bound to an abstract name made of
host and port (Linux): the kernel refuses a second claim and drops it when the process
dies, even by SIGKILL, and, like TCP ports, the names are per network namespace. The claim
listens, so a refused `serve` can ask the kernel (SO_PEERCRED) which process holds it.
"""

from __future__ import annotations

import errno
import socket
import struct
import sys
from collections.abc import Iterable

from tierproxy.config import Config, METRICS_PORT, PROXY_BOOTSTRAP_PORT
from tierproxy.config.broker_ports import NodePorts

__all__ = ("PortTaken", "claim_ports", "serve_ports")

_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class PortTaken(OSError):
    """Another `tierproxy serve` holds the port."""


def serve_ports(config: Config) -> list[tuple[str, int]]:
    """The ports `serve` listens on that its configuration names: the bootstrap listener,
    the metrics endpoint and, when a map or a node id range gives them, the broker nodes'
    (with proxy.broker.port.base every port from the base up is some node's; the bootstrap
    port stands for them)."""
    ports = [("bootstrap listener", config[PROXY_BOOTSTRAP_PORT]), ("metrics endpoint", config[METRICS_PORT])]
    nodes = NodePorts.of(config)
    if nodes.mapped is not None:
        ports += [(f"listener of broker node {node}", port) for node, port in nodes.mapped.items()]
    elif nodes.ids is not None:
        ports += [(f"listener of broker node {node}", nodes.start + node - nodes.ids[0]) for node in range(nodes.ids[0], nodes.ids[1] + 1)]
    return ports


def claim_ports(host: str, ports: Iterable[tuple[str, int]]) -> list[socket.socket]:
    """Claim every (what listens, port) on `host` (port 0 is skipped) for this process;
    the claims last until the sockets returned are closed or the process exits. PortTaken
    names the first port another `serve` holds, and its pid; nothing is claimed then."""
    if not sys.platform.startswith("linux"):
        return []  # abstract socket names are Linux's; elsewhere the kernel's own checks stay
    claims: list[socket.socket] = []
    try:
        for name, port in ports:
            if port == 0:
                continue
            claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                claim.bind(_address(host, port))
                claim.listen(64)
            except OSError as e:
                claim.close()
                if e.errno != errno.EADDRINUSE:
                    raise
                holder = _holder(host, port)
                raise PortTaken(errno.EADDRINUSE,
                                f"cannot open the {name} on {host}:{port}: {e.strerror}: another "
                                f"tierproxy serve{f' (pid {holder})' if holder else ''} holds it") from None
            claims.append(claim)
    except BaseException:
        for claim in claims:
            claim.close()
        raise
    return claims


def _address(host: str, port: int) -> str:
    return f"\0tierproxy serve {host}:{port}"


def _holder(host: str, port: int) -> int | None:
    """The pid of the process holding the claim, if it can be told."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(_address(host, port))
            pid, _, _ = _PEERCRED.unpack(probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        except OSError:
            return None
    return pid or None
