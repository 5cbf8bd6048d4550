"""docs/operations.md stays exact: its commands parse or run, its keys and metrics exist."""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

import javaproperties

from tierproxy.client.security import parse_jaas
from tierproxy.config import parse
from tierproxy.cli import build_parser
from tierproxy.metrics_docs import declared_families

DOC = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC, re.S)


def _commands(prefix: str) -> list[list[str]]:
    commands = []
    for block in _blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith(prefix):
                commands.append(shlex.split(line.strip()))
    return commands


def test_every_tierproxy_command_parses():
    commands = _commands("tierproxy ")
    assert len(commands) >= 5
    parser = build_parser()
    for command in commands:
        args = parser.parse_args(command[1:])
        assert args.command == command[1]


def test_the_properties_snippets_are_valid():
    tiering, secured, encrypted, *proxy_addresses = _blocks("properties")
    assert len(proxy_addresses) == 3
    for block in proxy_addresses:  # the node ports and advertised hosts pass the configuration check
        parse({"bootstrap.servers": "broker:9092", **javaproperties.loads(textwrap.dedent(block))})
    properties = javaproperties.loads(textwrap.dedent(tiering))
    config = parse({"bootstrap.servers": "broker:9092", **properties})
    assert [t.name for t in config.tiered_topics] == ["orders"]
    properties = javaproperties.loads(textwrap.dedent(secured))
    config = parse({"bootstrap.servers": "broker:9092", **properties})
    assert parse_jaas(config["sasl.jaas.config"], config["sasl.mechanism"]).username == "tierproxy"
    properties = javaproperties.loads(textwrap.dedent(encrypted))
    config = parse({"bootstrap.servers": "broker:9092", **properties})
    assert config["remote.log.storage.encryption.active.key"] == "k1"


def _without_chart_values(doc: str) -> str:
    """The doc less the Helm chart's values reference: its names (`proxy.enabled`) are
    values.schema.json's, checked against it by tests/deploy/test_helm.py, not configuration keys."""
    return re.sub(r"<!-- values reference:.*?\n\n", "", doc, flags=re.S)


def test_every_key_named_exists():
    config = parse({"bootstrap.servers": "broker:9092"})
    prefixes = "remote|tiered|metrics|spark|security|sasl|ssl|max|connections|request|socket|proxy"
    for key in set(re.findall(rf"`((?:{prefixes})\.[a-z.]+[a-z])`", _without_chart_values(DOC))):
        if (key.startswith("remote.log.manager.task.retry.backoff")
                or key in ("remote.storage.enable", "max.pending.tasks")):
            continue
        assert key in config.values, key


def test_every_metric_named_exists():
    """Against every family tierproxy declares (docs/metrics.md's), the proxy's and the pipeline's."""
    families = {f.name.removesuffix("_total") for f in declared_families()}
    named = re.findall(r"`(tierproxy_[a-z_]+)", DOC)
    named += [f"tierproxy_cache_{kind}_total" for kind in ("hits", "misses", "evictions", "prefetches")]
    for name in named:
        if name.endswith("_"):
            continue  # the `tierproxy_cache_{...}` shorthand, expanded above
        assert name.removesuffix("_total") in families, name


def test_kafka_configs_command_runs_against_the_broker(kafka_cluster, topic):
    (command,) = _commands("kafka-configs.sh")
    name = topic()
    args = [a.replace("BROKER:9092", kafka_cluster.bootstrap_servers).replace("orders", name) for a in command[1:]]
    result = kafka_cluster.java_tool("kafka.admin.ConfigCommand", *args, timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource("topic", name)
    configs = kafka_cluster.admin().describe_configs([resource])[resource].result(30)
    assert configs["retention.ms"].value == "-1" and configs["retention.bytes"].value == "-1"
