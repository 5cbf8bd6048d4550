"""The one configuration file shared by the proxy and the pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierproxy.config import KEYS, MIB, TOPIC_KEYS, ConfigError, load, parse

BASE = {"bootstrap.servers": "127.0.0.1:9092"}


def test_defaults_fill_every_key():
    config = parse(BASE)
    assert set(config.values) == set(KEYS)
    assert config["bootstrap.servers"] == ("127.0.0.1:9092",)
    assert config["remote.log.reader.max.pending.tasks"] == 100
    assert config["remote.fetch.max.wait.ms"] == 500
    assert config["remote.log.manager.task.retry.jitter"] == 0.2
    assert config["socket.request.max.bytes"] == 104857600


def test_the_kips_index_cache_name_is_accepted_in_megabytes():
    config = parse({**BASE, "remote.log.index.file.cache.total.size.mb": "64"})
    assert config["remote.log.index.file.cache.total.size.bytes"] == 64 * MIB
    with pytest.raises(ConfigError, match="same thing"):
        parse({**BASE, "remote.log.index.file.cache.total.size.mb": "64",
               "remote.log.index.file.cache.total.size.bytes": "1"})


def test_topic_overrides_and_kafka_defaults():
    config = parse({
        **BASE,
        "log.retention.ms": "1000",
        "topic.orders.v1.remote.storage.enable": "true",
        "topic.orders.v1.local.retention.bytes": "4096",
        "topic.clicks.remote.storage.enable": "false",
    })
    orders = config.topic("orders.v1")
    assert orders.remote_storage_enable and orders.local_retention_bytes == 4096
    # -2 (the default) means: follow retention.
    assert orders.local_retention_ms == orders.retention_ms == 1000
    assert [t.name for t in config.tiered_topics] == ["orders.v1"]
    assert not config.topic("never-named").remote_storage_enable


@pytest.mark.parametrize(
    "properties, message",
    [
        ({}, "bootstrap.servers is required"),
        ({**BASE, "remote.log.reader.thread": "3"}, "did you mean remote.log.reader.threads"),
        ({**BASE, "remote.log.storage.backend": "hdfs"}, "must be one of local, s3"),
        ({**BASE, "remote.log.reader.threads": "ten"}, "must be an integer"),
        ({**BASE, "remote.log.reader.threads": "0"}, "must be >= 1"),
        ({**BASE, "topic.t.remote.storage.enable": "yes"}, "topic.t.remote.storage.enable='yes': must be true or false"),
        ({**BASE, "topic.t.retention.ms": "-7"}, "topic.t.retention.ms"),
        ({**BASE, "remote.log.storage.backend": "s3"}, "remote.log.storage.s3.bucket is required"),
        ({**BASE, "tiered.storage.not.available.error.code": "3"}, "must be one of -1, 9, 7, 56"),
        ({"bootstrap.servers": "127.0.0.1"}, "bootstrap.servers='127.0.0.1': '127.0.0.1' is not host:port: no port"),
        ({"bootstrap.servers": "k:9092,k2:port"}, "'k2:port' is not host:port: the port must be a number"),
        ({"bootstrap.servers": "[::1"}, "no ']' after the IPv6 address"),
        ({**BASE, "topic.orders.local.retension.ms": "1"},
         "topic.orders.local.retension.ms: unknown configuration key (did you mean topic.orders.local.retention.ms"),
        ({**BASE, "topic.orders.v1.remote.storage.enabel": "true"},
         "did you mean topic.orders.v1.remote.storage.enable"),
        ({**BASE, "remote.log.manager.copy.max.bytes.per.second": "0"}, "must be >= 1"),
    ],
)
def test_bad_configuration_names_the_key(properties, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse(properties)


def test_kip_950_topic_keys_and_kafkas_rule_for_copy_disable():
    tiered = {**BASE, "topic.o.remote.storage.enable": "true"}
    topic = parse(tiered).topic("o")
    assert not topic.remote_log_copy_disable and not topic.remote_log_delete_on_disable
    # -2 (the default) is local retention = retention: accepted, as Kafka accepts it.
    assert parse({**tiered, "topic.o.remote.log.copy.disable": "true"}).topic("o").remote_log_copy_disable
    with pytest.raises(ConfigError, match="topic.o.remote.log.copy.disable=true: When `remote.log.copy.disable` is set "
                                          "to true, the `local.retention.bytes` and `retention.bytes` must be set"):
        parse({**tiered, "topic.o.remote.log.copy.disable": "true", "log.local.retention.bytes": "10"})
    assert parse({**tiered, "topic.o.remote.log.copy.disable": "true", "topic.o.local.retention.ms": "5",
                  "topic.o.retention.ms": "5"}).topic("o").local_retention_ms == 5
    # Not tiered: Kafka does not check it.
    parse({**BASE, "topic.o.remote.log.copy.disable": "true", "topic.o.local.retention.ms": "5"})
    assert parse({**BASE, "topic.o.remote.log.delete.on.disable": "true"}).topic("o").remote_log_delete_on_disable


def test_read_replica_topics_are_not_tiered_here():
    config = parse({**BASE, "topic.o.remote.log.read.replica": "true", "topic.p.remote.storage.enable": "true"})
    assert [t.name for t in config.read_replica_topics] == ["o"]
    assert [t.name for t in config.tiered_topics] == ["p"]
    with pytest.raises(ConfigError, match=r"topic\.o\.remote\.log\.read\.replica=true: a read replica serves another "
                                          r"cluster's remote log; it is not tiered itself"):
        parse({**BASE, "topic.o.remote.log.read.replica": "true", "topic.o.remote.storage.enable": "true"})


def test_host_port_lists_kafka_accepts():
    config = parse({"bootstrap.servers": "a:9092, [::1]:9093,10.0.0.1:1"})
    assert config["bootstrap.servers"] == ("a:9092", "[::1]:9093", "10.0.0.1:1")


def test_load_a_properties_file_with_overrides(tmp_path: Path):
    path = tmp_path / "tierproxy.properties"
    path.write_text("# tierproxy\nbootstrap.servers=127.0.0.1:9092\nremote.log.reader.threads = 4\n")
    config = load(path, ["remote.log.reader.threads=6", "metrics.port=0"])
    assert config["remote.log.reader.threads"] == 6 and config["metrics.port"] == 0
    with pytest.raises(ConfigError, match="not key=value"):
        load(path, ["metrics.port"])
    with pytest.raises(ConfigError, match=str(path)):
        load(path, ["metrics.port=-5"])
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.properties")


def test_raw_round_trips():
    config = parse({**BASE, "topic.a.remote.storage.enable": "true", "remote.log.storage.local.dir": "/tmp/x"})
    assert parse(config.raw()) == config


def test_every_key_is_documented():
    for key in [*KEYS.values(), *TOPIC_KEYS.values()]:
        assert key.doc.endswith("."), key.name


def test_the_code_reads_configuration_through_typed_keys():
    """Every key is a constant of tierproxy.config (a ConfigKey, typed by its value), and the
    packages look values up with those constants, never with a string literal."""
    import pathlib
    import re

    import tierproxy.config as config_module
    from tierproxy.config import KEYS, ConfigKey

    constants = {v.name: v for v in vars(config_module).values() if isinstance(v, ConfigKey)}
    assert set(KEYS) <= set(constants)
    root = pathlib.Path(config_module.__file__).resolve().parents[1]
    literal = re.compile(r'config\[\s*["\']')
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for folder in ("tierproxy", "protocol", "config", "client", "storage", "cache", "proxy", "pipeline")
        for path in (root / folder).rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if literal.search(line)
    ]
    assert not offenders, offenders
