"""Which `tierproxy serve` owns a port: one per bound address and port, like a broker's listener.

The workers of one `serve` share their listeners through SO_REUSEPORT, and the kernel lets
any process of the same user join such a port, so a second `serve` on the same addresses
would quietly take part of the traffic. Before anything listens, `serve` therefore claims
each address its listeners will bind (the listener host resolved as the bind resolves it:
`localhost` and `127.1` are 127.0.0.1, an empty host is every IPv4 and IPv6 address) and
port, with a Unix socket bound to an abstract name made of them (Linux): the kernel refuses
a second claim of the same name and drops it when the process dies, even by SIGKILL, and,
like TCP ports, the names are per network namespace. A wildcard (0.0.0.0, ::) takes every
connection of its family on the port that no specific address takes, so it clashes with
the specific addresses of its family too: after claiming, `serve` reads the other claims
from /proc/net/unix and refuses any that overlaps one of its own (two starting at the same
instant may both refuse; neither joins the other). The claim listens, so a refused `serve`
can ask the kernel (SO_PEERCRED) which process holds it.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from tierproxy.config import Config, METRICS_PORT, PROXY_BOOTSTRAP_PORT
from tierproxy.config.broker_ports import NodePorts

__all__ = ("Endpoint", "PortTaken", "bound_addresses", "claim_ports", "serve_ports")

_PEERCRED = struct.Struct("3i")  # pid, uid, gid
_PREFIX = "tierproxy serve "
_LISTENING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's flags
_COMMAND_LINE_CHARS = 200


class PortTaken(OSError):
    """Another `tierproxy serve` holds the port."""


class Endpoint(NamedTuple):
    """An address a listener binds (as getaddrinfo gives it) and its port."""

    address: str
    port: int

    def __str__(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"

    def overlaps(self, other: Endpoint) -> bool:
        """Whether a connection could reach either one's listener, the same user's
        SO_REUSEPORT letting both bind: the same address, or a wildcard and an address of
        its family (an IPv6 listener binds IPv6 only, IPV6_V6ONLY)."""
        if self.port != other.port or self.address == other.address:
            return self.port == other.port
        mine, theirs = (ipaddress.ip_address(e.address.split("%")[0]) for e in (self, other))
        return mine.version == theirs.version and (mine.is_unspecified or theirs.is_unspecified)


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


def bound_addresses(host: str, port: int) -> list[Endpoint]:
    """What a listener on `host` binds, resolved as the event loop's create_server resolves
    it (an empty host is every interface)."""
    found = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    out: list[Endpoint] = []
    for family, _, _, _, address in found:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        scope = address[3] if family == socket.AF_INET6 else 0  # type: ignore[misc]  # IPv6's 4-tuple
        endpoint = Endpoint(f"{address[0]}%{scope}" if scope else str(address[0]), port)
        if endpoint not in out:
            out.append(endpoint)
    return out


def claim_ports(host: str, ports: Iterable[tuple[str, int]]) -> list[socket.socket]:
    """Claim every address `host` binds on every (what listens, port) (port 0 is skipped)
    for this process; the claims last until the sockets returned are closed or the process
    exits. PortTaken names the first port another `serve` holds an overlapping claim on,
    each address that clashes and the pid (and command line) holding it; nothing is claimed
    then."""
    if not sys.platform.startswith("linux"):
        return []  # abstract socket names are Linux's; elsewhere the kernel's own checks stay
    claims: dict[int, tuple[Endpoint, socket.socket]] = {}  # by the claim's inode
    try:
        for name, port in ports:
            if port == 0:
                continue
            wanted = bound_addresses(host, port)
            clashes: list[Endpoint] = []
            for endpoint in wanted:
                claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    claim.bind(_name(endpoint))
                    claim.listen(64)
                except OSError as e:
                    claim.close()
                    if e.errno != errno.EADDRINUSE:
                        raise
                    clashes.append(endpoint)
                    continue
                claims[os.fstat(claim.fileno()).st_ino] = (endpoint, claim)
            # The exact names the kernel refused above; overlaps with wildcards only show here.
            clashes += [theirs for inode, theirs in _claims() if inode not in claims and theirs not in clashes
                        and any(endpoint.overlaps(theirs) for endpoint in wanted)]
            if clashes:
                raise PortTaken(errno.EADDRINUSE,
                                f"cannot open the {name} on {host}:{port}: {os.strerror(errno.EADDRINUSE)}: "
                                + "; ".join(f"another tierproxy serve{_holder(theirs)} holds {theirs}"
                                            for theirs in clashes))
    except BaseException:
        for _, claim in claims.values():
            claim.close()
        raise
    return [claim for _, claim in claims.values()]


def _name(endpoint: Endpoint) -> str:
    return f"\0{_PREFIX}{endpoint}"


def _claims() -> list[tuple[int, Endpoint]]:
    """Every listening claim in this network namespace: (inode, endpoint)."""
    out = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split(None, 7)  # Num RefCount Protocol Flags Type St Inode Path
        if len(fields) < 8 or not fields[7].startswith("@" + _PREFIX) or not int(fields[3], 16) & _LISTENING:
            continue
        address, _, port = fields[7][1 + len(_PREFIX):].rpartition(":")
        out.append((int(fields[6]), Endpoint(address.strip("[]"), int(port))))
    return out


def _holder(endpoint: Endpoint) -> str:
    """' (pid N: its command line)' of the process holding the claim, if it can be told."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(_name(endpoint))
            pid, _, _ = _PEERCRED.unpack(probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        except OSError:
            return ""
    if not pid:
        return ""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return f" (pid {pid})"
    if len(command) > _COMMAND_LINE_CHARS:
        command = command[:_COMMAND_LINE_CHARS] + "..."
    return f" (pid {pid}: {command})" if command else f" (pid {pid})"
