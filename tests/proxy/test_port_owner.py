"""One `tierproxy serve` per port: a claim is refused while another process holds it, names
the holder, and is free again once the holder lets go."""

from __future__ import annotations

import os

import pytest

from tierproxy.config import load
from tierproxy.proxy.port_owner import PortTaken, claim_ports, serve_ports
from testbed.ports import LOOPBACK, free_ports


def test_a_claimed_port_is_refused_naming_the_holder_until_released():
    bootstrap, metrics, other = free_ports(3)
    claims = claim_ports(LOOPBACK, [("bootstrap listener", bootstrap), ("metrics endpoint", metrics)])
    try:
        with pytest.raises(PortTaken) as refused:
            claim_ports(LOOPBACK, [("bootstrap listener", other), ("metrics endpoint", metrics)])
        assert str(refused.value) == (f"[Errno 98] cannot open the metrics endpoint on {LOOPBACK}:{metrics}: "
                                      f"Address already in use: another tierproxy serve (pid {os.getpid()}) holds it")
        # the refused call kept nothing: its first port is free
        claims += claim_ports(LOOPBACK, [("bootstrap listener", other)])
        claims += claim_ports("127.0.0.2", [("bootstrap listener", bootstrap)])  # another host, another claim
    finally:
        for claim in claims:
            claim.close()
    for claim in claim_ports(LOOPBACK, [("bootstrap listener", bootstrap), ("metrics endpoint", metrics)]):
        claim.close()


def test_serve_claims_bootstrap_metrics_and_the_node_ports_its_configuration_names():
    ranged = load(None, ["bootstrap.servers=b:9092", "proxy.bootstrap.port=9192", "metrics.port=9404",
                         "proxy.broker.node.id.range=1-2", "proxy.broker.port.start=9300"])
    assert serve_ports(ranged) == [("bootstrap listener", 9192), ("metrics endpoint", 9404),
                                   ("listener of broker node 1", 9300), ("listener of broker node 2", 9301)]
    mapped = load(None, ["bootstrap.servers=b:9092", "proxy.bootstrap.port=9192", "proxy.broker.port.map=5:9500"])
    assert serve_ports(mapped)[2:] == [("listener of broker node 5", 9500)]
