"""The `tierproxy` command line: `--log-level` on every subcommand, the version, and bad
values that end in one line, never a traceback."""

from __future__ import annotations

import argparse
import logging
import subprocess

import pytest

from tierproxy.cli import LOG_LEVELS, build_parser, configure_logging, log_format
from tierproxy.config.metrics import tierproxy_version
from tests.helpers.commands import TIERPROXY, wait_listening, write_properties
from tests.helpers.serve import start_serving
from tests.helpers.wait import wait_for


def _leaf_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every runnable subcommand, as the words that name it (`config check`, `serve`, ...)."""
    leaves = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                leaves += _leaf_commands(sub, (*prefix, name))
    return leaves or [prefix]


def test_every_subcommand_takes_a_log_level():
    parser = build_parser()
    leaves = _leaf_commands(parser)
    assert {("serve",), ("tier",), ("status",), ("config", "check"), ("config", "docs"), ("config", "metrics"),
            ("loadtest",)} <= set(leaves)
    required = {("loadtest",): ["--bootstrap", "h:1", "--topic", "t"]}
    for words in leaves:
        extra = required.get(words, [])
        assert parser.parse_args([*words, *extra, "--log-level", "debug"]).log_level == "DEBUG"
        default = parser.parse_args([*words, *extra]).log_level
        # Long-running work logs its progress by default: the proxy, the pipeline and its table steps.
        long_running = (("serve",), ("tier",), ("iceberg", "backfill"), ("iceberg", "maintain"))
        assert default == ("INFO" if words in long_running else "WARNING"), words
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--log-level", "LOUD"])


def test_the_log_level_is_the_root_loggers_and_a_worker_names_itself():
    root = logging.getLogger()
    before = root.level
    try:
        args = build_parser().parse_args(["serve", "--log-level", "ERROR", "--worker-of", "1", "--worker-index", "3"])
        configure_logging(args)
        assert root.level == logging.ERROR
        assert "worker-3 %(name)s" in log_format(args)
        assert "worker-" not in log_format(build_parser().parse_args(["serve"]))
        assert all(level in logging.getLevelNamesMapping() for level in LOG_LEVELS)
    finally:
        root.setLevel(before)


def test_version_is_the_installed_distributions():
    assert tierproxy_version() not in ("", "unknown")
    done = subprocess.run([str(TIERPROXY), "--version"], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == f"tierproxy {tierproxy_version()}"


def test_a_broker_address_without_a_port_is_one_line_for_every_command(tmp_path):
    properties = tmp_path / "tierproxy.properties"
    properties.write_text("bootstrap.servers=127.0.0.1\nmetrics.port=0\n")
    for command in (["config", "check"], ["status"], ["serve"]):
        done = subprocess.run([str(TIERPROXY), *command, "--config", str(properties)], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2, (command, done.stderr)
        assert "Traceback" not in done.stderr
        assert "bootstrap.servers='127.0.0.1': '127.0.0.1' is not host:port: no port" in done.stderr, done.stderr


def test_tier_says_where_the_pipelines_metrics_port_went(tmp_path):
    from testbed.ports import free_port

    properties = tmp_path / "tierproxy.properties"
    properties.write_text(f"bootstrap.servers=127.0.0.1:{free_port()}\nmetrics.port=9500\n"
                          f"remote.log.metadata.dir={tmp_path / 'metadata'}\n")
    done = subprocess.run([str(TIERPROXY), "tier", "--config", str(properties)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stderr  # no broker there
    assert "metrics.port=9500 is the metrics port of `tierproxy serve` only; `tierproxy tier --every` serves " \
           "its metrics on pipeline.metrics.port (9405, its default)" in done.stderr, done.stderr


def test_a_serve_that_cannot_start_says_why_in_one_line_and_closes_its_store_client(kafka_cluster, s3_server,
                                                                                    tmp_path):
    """The replica's metadata in a bucket that does not exist: a start that fails on the
    store exits 1 naming it, without a traceback or "Unclosed client session" after it."""
    from testbed.ports import free_ports

    proxy, node = free_ports(2)
    settings = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "proxy.bootstrap.port": str(proxy),
                "proxy.broker.port.base": str(node), "metrics.port": "0", "proxy.workers": "1",
                **s3_server.storage_properties("serve-no-bucket"), "remote.log.storage.s3.bucket": "no-such-bucket",
                "remote.log.metadata.backend": "remote", "topic.orders.remote.log.read.replica": "true"}
    properties = write_properties(tmp_path / "proxy.properties", settings)
    done = subprocess.run([str(TIERPROXY), "serve", "--config", str(properties)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    assert "tierproxy serve: get s3://no-such-bucket/serve-no-bucket/__remote_log_metadata/head" in done.stderr
    assert "NoSuchBucket" in done.stderr
    assert "Traceback" not in done.stderr and "Unclosed" not in done.stderr, done.stderr


def test_serve_logs_at_the_level_asked_for(tmp_path):
    """--log-level ERROR hides the WARNING an unreachable broker gives, and reaches the workers."""
    from testbed.ports import free_ports

    broker, proxy, node = free_ports(3)
    settings = {"bootstrap.servers": f"127.0.0.1:{broker}", "proxy.bootstrap.port": proxy,
                "proxy.broker.port.base": node, "metrics.port": 0, "proxy.workers": 2,
                "remote.log.storage.local.dir": tmp_path / "remote", "remote.log.metadata.dir": tmp_path / "metadata"}
    outputs = {}
    for level in ("INFO", "ERROR"):
        served = start_serving(settings, tmp_path, "--log-level", level)
        try:
            if level == "INFO":  # each worker says so once it listens
                served.wait_for(r"INFO worker-\d tierproxy: tierproxy serving on", 2)
            else:  # nothing to wait for in the output: the port and both workers
                wait_listening(proxy, served.process)
                wait_for(lambda: len(served.workers()) == 2, 60, "two workers")
        finally:
            assert served.stop() == 0, served.output
        outputs[level] = served.output
    assert "WARNING tierproxy: no broker answered yet" in outputs["INFO"]
    assert "INFO worker-1 tierproxy: tierproxy serving on" in outputs["INFO"]
    assert outputs["ERROR"].strip() == "", outputs["ERROR"]

