"""One `tierproxy serve` per bound address and port: a claim is refused while another
process holds the same address or one that overlaps it (a wildcard of its family), the
refusal names each clash and its holder, and the port is free again once the holder lets go."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tierproxy.config import load
from tierproxy.proxy.port_owner import Endpoint, PortTaken, bound_addresses, claim_ports, serve_ports
from testbed.ports import LOOPBACK, free_ports

COMMAND_LINE = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def holder_command(message: str) -> str:
    """The holder's command line a refusal names (cut short if long)."""
    return message.split(f"another tierproxy serve (pid {os.getpid()}: ", 1)[1].rsplit(") holds ", 1)[0]


def test_a_claimed_port_is_refused_naming_the_holder_until_released():
    bootstrap, metrics, other = free_ports(3)
    claims = claim_ports(LOOPBACK, [("bootstrap listener", bootstrap), ("metrics endpoint", metrics)])
    try:
        with pytest.raises(PortTaken) as refused:
            claim_ports(LOOPBACK, [("bootstrap listener", other), ("metrics endpoint", metrics)])
        message = str(refused.value)
        assert message.startswith(f"[Errno 98] cannot open the metrics endpoint on {LOOPBACK}:{metrics}: "
                                  f"Address already in use: another tierproxy serve (pid {os.getpid()}: ")
        assert message.endswith(f") holds {LOOPBACK}:{metrics}")
        assert holder_command(message) and COMMAND_LINE.startswith(holder_command(message).removesuffix("..."))
        # the refused call kept nothing: its first port is free
        claims += claim_ports(LOOPBACK, [("bootstrap listener", other)])
        claims += claim_ports("127.0.0.2", [("bootstrap listener", bootstrap)])  # another address, another claim
    finally:
        for claim in claims:
            claim.close()
    for claim in claim_ports(LOOPBACK, [("bootstrap listener", bootstrap), ("metrics endpoint", metrics)]):
        claim.close()


def test_the_claim_is_the_address_the_listener_binds_not_the_host_text():
    assert bound_addresses("localhost", 9192)[0] == Endpoint("127.0.0.1", 9192)
    assert bound_addresses("127.1", 9192) == [Endpoint("127.0.0.1", 9192)]
    assert bound_addresses("", 9192) == [Endpoint("0.0.0.0", 9192), Endpoint("::", 9192)]  # every interface
    port, = free_ports(1)
    claims = claim_ports(LOOPBACK, [("bootstrap listener", port)])
    try:
        for host in ("localhost", "127.1", "0.0.0.0", ""):
            with pytest.raises(PortTaken) as refused:
                claim_ports(host, [("bootstrap listener", port)])
            assert str(refused.value).startswith(f"[Errno 98] cannot open the bootstrap listener on {host}:{port}: "
                                                 f"Address already in use: another tierproxy serve (pid {os.getpid()}: ")
            assert str(refused.value).endswith(f") holds {LOOPBACK}:{port}")
        claims += claim_ports("::1", [("bootstrap listener", port)])  # IPv6 listeners take IPv6 only
    finally:
        for claim in claims:
            claim.close()


def test_a_wildcard_clashes_with_every_address_of_its_family_on_the_port():
    port, = free_ports(1)
    claims = claim_ports("0.0.0.0", [("bootstrap listener", port)])
    try:
        with pytest.raises(PortTaken) as refused:
            claim_ports("127.0.0.2", [("bootstrap listener", port)])
        assert str(refused.value).endswith(f") holds 0.0.0.0:{port}")
        claims += claim_ports("::", [("bootstrap listener", port)])
        # every interface: both wildcards clash, each named
        with pytest.raises(PortTaken) as refused:
            claim_ports("", [("bootstrap listener", port)])
        assert str(refused.value).count(f"another tierproxy serve (pid {os.getpid()}: ") == 2
        assert f") holds 0.0.0.0:{port}; another" in str(refused.value)
        assert str(refused.value).endswith(f") holds [::]:{port}")
        with pytest.raises(PortTaken) as refused:
            claim_ports("::1", [("bootstrap listener", port)])
        assert str(refused.value).endswith(f") holds [::]:{port}")
    finally:
        for claim in claims:
            claim.close()
    claims = claim_ports("127.0.0.2", [("bootstrap listener", port)])
    try:
        with pytest.raises(PortTaken) as refused:  # the other way round
            claim_ports("0.0.0.0", [("bootstrap listener", port)])
        assert str(refused.value).endswith(f") holds 127.0.0.2:{port}")
    finally:
        for claim in claims:
            claim.close()
    for claim in claim_ports("", [("bootstrap listener", port)]):  # nothing left behind
        claim.close()


def test_serve_claims_bootstrap_metrics_and_the_node_ports_its_configuration_names():
    ranged = load(None, ["bootstrap.servers=b:9092", "proxy.bootstrap.port=9192", "metrics.port=9404",
                         "proxy.broker.node.id.range=1-2", "proxy.broker.port.start=9300"])
    assert serve_ports(ranged) == [("bootstrap listener", 9192), ("metrics endpoint", 9404),
                                   ("listener of broker node 1", 9300), ("listener of broker node 2", 9301)]
    mapped = load(None, ["bootstrap.servers=b:9092", "proxy.bootstrap.port=9192", "proxy.broker.port.map=5:9500"])
    assert serve_ports(mapped)[2:] == [("listener of broker node 5", 9500)]
