"""Node ids to proxy ports and advertised hosts: what each setting gives, and what the
configuration check refuses, with messages naming the keys."""

from __future__ import annotations

import pytest

from tierproxy.config import ConfigError, parse
from tierproxy.config.broker_ports import NodePorts, advertised_host


def _config(**settings: object):  # type: ignore[no-untyped-def]
    return parse({"bootstrap.servers": "b:9092", **{k: str(v) for k, v in settings.items()}})


def _ports(**settings: object) -> NodePorts:
    return NodePorts.of(_config(**settings))


def test_the_base_gives_every_node_id_that_is_a_port():
    ports = _ports()
    assert (ports.port(0), ports.port(1001), ports.port(65535 - 9193), ports.port(65536 - 9193)) == (
        9193, 10194, 65535, None)
    assert ports.describe() == "proxy.broker.port.base=9193"


def test_a_node_id_range_counts_from_its_start_port():
    ports = _ports(**{"proxy.broker.node.id.range": "1000-1099", "proxy.broker.port.start": 9194})
    assert [ports.port(n) for n in (999, 1000, 1001, 1099, 1100)] == [None, 9194, 9195, 9293, None]
    assert ports.node_at(9195) == 1001 and ports.node_at(9193) is None and ports.node_at(9294) is None


def test_a_port_map_gives_exactly_its_nodes():
    ports = _ports(**{"proxy.broker.port.map": "1001:9194, 1002:9196"})
    assert [ports.port(n) for n in (1001, 1002, 1003)] == [9194, 9196, None]
    assert ports.describe() == "proxy.broker.port.map=1001:9194,1002:9196"


def test_the_host_pattern_names_each_node_and_the_bootstrap_keeps_the_advertised_host():
    config = _config(**{"proxy.advertised.host": "kafka.example.com",
                        "proxy.advertised.host.pattern": "broker-$(nodeId).kafka.example.com"})
    assert advertised_host(config, 1001) == "broker-1001.kafka.example.com"
    assert advertised_host(config, None) == "kafka.example.com"
    plain = _config(**{"proxy.listener.host": "10.0.0.5"})
    assert advertised_host(plain, 7) == advertised_host(plain, None) == "10.0.0.5"


@pytest.mark.parametrize("settings, message", [
    ({"proxy.broker.port.map": "1001:9194,1002:9194"},
     "proxy.broker.port.map='1001:9194,1002:9194': nodes 1001 and 1002 overlap: both on port 9194"),
    ({"proxy.broker.port.map": "1001:9194,1001:9195"}, "proxy.broker.port.map='1001:9194,1001:9195': node 1001 is listed twice"),
    ({"proxy.broker.port.map": "1001"}, "proxy.broker.port.map='1001': entry '1001' is not NODE:PORT"),
    ({"proxy.broker.port.map": "1001:70000"}, "proxy.broker.port.map='1001:70000': entry '1001:70000': port 70000 "
                                              "is not in [1, 65535]"),
    ({"proxy.broker.port.map": "1001:9194", "proxy.broker.node.id.range": "1000-1099",
      "proxy.broker.port.start": 9300},
     "proxy.broker.port.map and proxy.broker.node.id.range both give the brokers' ports; give only one"),
    ({"proxy.broker.node.id.range": "1099-1000", "proxy.broker.port.start": 9194},
     "proxy.broker.node.id.range='1099-1000': starts above its end (1099 > 1000)"),
    ({"proxy.broker.node.id.range": "1000..1099"}, "proxy.broker.node.id.range='1000..1099': is not LOW-HIGH"),
    ({"proxy.broker.node.id.range": "1000-1099"},
     "proxy.broker.node.id.range needs proxy.broker.port.start, the port of its first node id"),
    ({"proxy.broker.port.start": 9194},
     "proxy.broker.port.start is the port of the first node id of proxy.broker.node.id.range, which is not set"),
    ({"proxy.broker.node.id.range": "1000-1099", "proxy.broker.port.start": 65500},
     "proxy.broker.node.id.range=1000-1099, proxy.broker.port.start=65500 puts node 1099 on port 65599, past 65535"),
    ({"proxy.broker.node.id.range": "1000-1099", "proxy.broker.port.start": 9150},
     "proxy.bootstrap.port=9192 is the port of broker node 1042 (proxy.broker.node.id.range=1000-1099, "
     "proxy.broker.port.start=9150)"),
    ({"proxy.broker.port.map": "1001:9404"},
     "metrics.port=9404 is the port of broker node 1001 (proxy.broker.port.map=1001:9404)"),
    ({"metrics.port": 9192}, "proxy.bootstrap.port and metrics.port are both 9192"),
    ({"proxy.advertised.host.pattern": "broker.example.com"},
     "proxy.advertised.host.pattern='broker.example.com': has no $(nodeId)"),
    ({"proxy.advertised.host.pattern": "$(nodeId).$(cluster).example.com"},
     "proxy.advertised.host.pattern='$(nodeId).$(cluster).example.com': $(nodeId) is the only placeholder"),
    ({"proxy.advertised.host.pattern": "broker $(nodeId)"},
     "proxy.advertised.host.pattern='broker $(nodeId)': is not a host name"),
])
def test_the_configuration_check_refuses(settings, message):
    with pytest.raises(ConfigError) as raised:
        _config(**settings)
    assert str(raised.value).startswith(message), str(raised.value)


def test_ephemeral_bootstrap_and_metrics_ports_clash_with_nothing():
    _config(**{"proxy.broker.node.id.range": "0-9", "proxy.broker.port.start": 1, "proxy.bootstrap.port": 0,
               "metrics.port": 0})
