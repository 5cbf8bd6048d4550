"""Where the proxy listens for each broker node, and the host it advertises for it.

A node's port comes from one of three settings (Kroxylicious' "port identifies node"):

- `proxy.broker.port.map`: `NODE:PORT[,NODE:PORT...]`, node by node;
- `proxy.broker.node.id.range` `LOW-HIGH` with `proxy.broker.port.start`: node n listens
  on start + (n - LOW);
- neither: `proxy.broker.port.base` + node id, for every node id that gives a TCP port.

A node id the setting does not cover has no port (`NodePorts.port` is None). The host
advertised for node n is `proxy.advertised.host.pattern` with `$(nodeId)` replaced by n
(Kroxylicious' placeholder), else `proxy.advertised.host`, else `proxy.listener.host`.
Pure functions of the configuration values: the configuration check and the proxy use
the same ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # config/__init__.py imports this module
    from . import Settings

__all__ = ("NODE_ID_PLACEHOLDER", "NodePorts", "advertised_host", "check_host_pattern", "node_id_range",
           "port_map")

NODE_ID_PLACEHOLDER = "$(nodeId)"
MAX_PORT = 65535
MAP, RANGE, START, BASE = ("proxy.broker.port.map", "proxy.broker.node.id.range", "proxy.broker.port.start",
                           "proxy.broker.port.base")
_HOST = re.compile(r"^[A-Za-z0-9_.:-]+$")  # a DNS name or an IP address, once the node id is in


def port_map(entries: Iterable[str]) -> dict[int, int]:
    """`NODE:PORT` entries as {node id: port}; ValueError names the entry or the clash."""
    ports: dict[int, int] = {}
    nodes_by_port: dict[int, int] = {}
    for entry in entries:
        node, sep, port = (part.strip() for part in entry.partition(":"))
        if not sep or not node.isdigit() or not port.isdigit():
            raise ValueError(f"entry {entry!r} is not NODE:PORT (a node id >= 0, a port)")
        node_id, number = int(node), int(port)
        if not 1 <= number <= MAX_PORT:
            raise ValueError(f"entry {entry!r}: port {number} is not in [1, {MAX_PORT}]")
        if node_id in ports:
            raise ValueError(f"node {node_id} is listed twice")
        if number in nodes_by_port:
            raise ValueError(f"nodes {nodes_by_port[number]} and {node_id} overlap: both on port {number}")
        ports[node_id] = number
        nodes_by_port[number] = node_id
    return ports


def node_id_range(text: str) -> tuple[int, int] | None:
    """`LOW-HIGH` as (low, high), None when empty; ValueError says what is wrong."""
    if not text:
        return None
    low, sep, high = (part.strip() for part in text.partition("-"))
    if not sep or not low.isdigit() or not high.isdigit():
        raise ValueError("is not LOW-HIGH (node ids >= 0, e.g. 1000-1099)")
    if int(low) > int(high):
        raise ValueError(f"starts above its end ({low} > {high})")
    return int(low), int(high)


def check_host_pattern(pattern: str) -> None:
    """ValueError unless the pattern names a host once `$(nodeId)` is replaced."""
    if not pattern:
        return
    if NODE_ID_PLACEHOLDER not in pattern:
        raise ValueError(f"has no {NODE_ID_PLACEHOLDER} (for one host for every broker, use proxy.advertised.host)")
    if "$(" in pattern.replace(NODE_ID_PLACEHOLDER, ""):
        raise ValueError(f"{NODE_ID_PLACEHOLDER} is the only placeholder")
    if not _HOST.match(pattern.replace(NODE_ID_PLACEHOLDER, "0")):
        raise ValueError("is not a host name once the node id is in (letters, digits, '.', '-', '_', ':')")


def advertised_host(values: Settings, node_id: int | None) -> str:
    """The host clients are told for broker node `node_id` (None: the bootstrap listener)."""
    pattern = values["proxy.advertised.host.pattern"]
    if node_id is not None and pattern:
        return pattern.replace(NODE_ID_PLACEHOLDER, str(node_id))
    return values["proxy.advertised.host"] or values["proxy.listener.host"]


@dataclass(frozen=True)
class NodePorts:
    """Broker node id -> the port of the proxy's listener for it."""

    mapped: Mapping[int, int] | None
    ids: tuple[int, int] | None
    start: int
    base: int

    @classmethod
    def of(cls, values: Settings) -> NodePorts:
        """From parsed configuration values (a Config or its mapping)."""
        mapped = port_map(values[MAP]) if values[MAP] else None
        return cls(mapped, node_id_range(values[RANGE]), values[START], values[BASE])

    def port(self, node_id: int) -> int | None:
        """The node's port; None when the setting gives it none."""
        if self.mapped is not None:
            return self.mapped.get(node_id)
        if self.ids is not None:
            low, high = self.ids
            return self.start + node_id - low if low <= node_id <= high else None
        port = self.base + node_id
        return port if node_id >= 0 and port <= MAX_PORT else None

    def node_at(self, port: int) -> int | None:
        """The node whose listener is `port`, if any (with `proxy.broker.port.base`, any port
        from the base up is some node's)."""
        if self.mapped is not None:
            return next((node for node, p in self.mapped.items() if p == port), None)
        if self.ids is not None:
            node = self.ids[0] + port - self.start
            return node if self.ids[0] <= node <= self.ids[1] else None
        return port - self.base if self.base <= port else None

    def describe(self) -> str:
        """The settings that give the ports, as `key=value`, for messages."""
        if self.mapped is not None:
            return f"{MAP}={','.join(f'{n}:{p}' for n, p in self.mapped.items())}"
        if self.ids is not None:
            return f"{RANGE}={self.ids[0]}-{self.ids[1]}, {START}={self.start}"
        return f"{BASE}={self.base}"


def check(values: Settings) -> None:
    """What no single key can tell: ValueError naming the keys."""
    if values[MAP] and values[RANGE]:
        raise ValueError(f"{MAP} and {RANGE} both give the brokers' ports; give only one")
    if values[RANGE] and not values[START]:
        raise ValueError(f"{RANGE} needs {START}, the port of its first node id")
    if values[START] and not values[RANGE]:
        raise ValueError(f"{START} is the port of the first node id of {RANGE}, which is not set")
    bootstrap = values["proxy.bootstrap.port"]
    if bootstrap and bootstrap == values["metrics.port"]:
        raise ValueError(f"proxy.bootstrap.port and metrics.port are both {bootstrap}")
    ports = NodePorts.of(values)
    if ports.ids is not None:
        last = ports.start + ports.ids[1] - ports.ids[0]
        if last > MAX_PORT:
            raise ValueError(f"{ports.describe()} puts node {ports.ids[1]} on port {last}, past {MAX_PORT}")
    if ports.mapped is None and ports.ids is None:
        return  # the base reaches every port above it: only a node that exists can clash
    for key in ("proxy.bootstrap.port", "metrics.port"):
        node = ports.node_at(values[key]) if values[key] else None
        if node is not None:
            raise ValueError(f"{key}={values[key]} is the port of broker node {node} ({ports.describe()})")
