"""A real Prometheus (Debian's, on loopback) with deploy/prometheus.yml and the rules of
deploy/rules/ scrapes a running `tierproxy serve` and a running `tierproxy tier --every`,
started from one properties file (each on its own metrics port):
both targets are up, every rule evaluates healthy, a recording rule over the pipeline's
metrics has a value, and every query of the Grafana dashboard runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from testbed.ports import free_ports
from testbed.processes import stop_pids
from tests.deploy.rules import DEPLOY, expressions, metric_samples, rules
from tests.helpers.commands import SPARK_ENV, TIERPROXY, write_properties
from tests.helpers.produce import produce_codecs

DEADLINE_S = 240.0


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read().decode()
    return json.loads(body) if "/api/" in url else body


def _wait(what: str, check: Callable[[], Any], deadline: float, processes: dict[str, subprocess.Popen]) -> Any:
    while True:
        for name, process in processes.items():
            assert process.poll() is None, f"{name} exited with {process.returncode}"
        try:
            result = check()
            if result:
                return result
        except OSError:
            pass
        assert time.monotonic() < deadline, f"not within {DEADLINE_S:.0f} s: {what}"
        time.sleep(0.5)


def _prometheus_config(tmp_path: Path, ports: dict[str, int]) -> Path:
    """deploy/prometheus.yml with its targets on loopback, scraping and evaluating every
    second; its rule_files, relative to deploy/, made absolute."""
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(DEPLOY / pattern) for pattern in config["rule_files"]]
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [f"127.0.0.1:{ports[job['job_name']]}"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


async def test_prometheus_evaluates_the_rules_over_a_running_proxy_and_pipeline(kafka_cluster, topic, tmp_path):
    prometheus_binary = shutil.which("prometheus")
    assert prometheus_binary, "prometheus is not installed: make system (Debian's prometheus package)"
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=2)
    await produce_codecs(bootstrap, name, 2, 1_000)
    proxy_port, node_port, proxy_metrics, pipeline_metrics, web = free_ports(5)
    properties = write_properties(tmp_path / "tierproxy.properties", {
        "bootstrap.servers": bootstrap, "proxy.bootstrap.port": str(proxy_port),
        "proxy.broker.port.base": str(node_port), "proxy.workers": "1", "spark.master": "local[1]",
        # one file for both, as deploy/tierproxy.properties: each command its own metrics port
        "metrics.port": str(proxy_metrics), "pipeline.metrics.port": str(pipeline_metrics),
        "remote.log.storage.local.dir": str(tmp_path / "remote"), "remote.log.metadata.dir": str(tmp_path / "metadata"),
        f"topic.{name}.remote.storage.enable": "true", f"topic.{name}.segment.bytes": str(16 * 1024),
    })
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("serve", "tier", "prometheus")}
    processes: dict[str, subprocess.Popen] = {}
    try:
        processes["serve"] = subprocess.Popen(
            [str(TIERPROXY), "serve", "--config", str(properties)],
            stdout=logs["serve"], stderr=subprocess.STDOUT)
        processes["tier"] = subprocess.Popen(
            [str(TIERPROXY), "tier", "--config", str(properties), "--every", "3s"], stdout=logs["tier"], stderr=subprocess.STDOUT, env=SPARK_ENV)
        config = _prometheus_config(tmp_path, {"tierproxy-proxy": proxy_metrics, "tierproxy-pipeline": pipeline_metrics})
        processes["prometheus"] = subprocess.Popen(
            [prometheus_binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{web}"], stdout=logs["prometheus"], stderr=subprocess.STDOUT)
        api = f"http://127.0.0.1:{web}/api/v1"
        deadline = time.monotonic() + DEADLINE_S

        def query(expression: str) -> list[dict]:
            answer = _get(f"{api}/query?query={urllib.parse.quote(expression)}")
            assert answer["status"] == "success", (expression, answer)
            return answer["data"]["result"]

        # Both targets up.
        _wait("both targets up", lambda: {r["metric"]["job"] for r in query("up == 1")} ==
              {"tierproxy-proxy", "tierproxy-pipeline"}, deadline, processes)
        # A recording rule over the pipeline's gauges has a value once a pass tiered something.
        size = _wait("a value of tierproxy:remote_log_size_bytes:sum",
                     lambda: [r for r in query("tierproxy:remote_log_size_bytes:sum") if float(r["value"][1]) > 0],
                     deadline, processes)
        assert size[0]["metric"] == {"__name__": "tierproxy:remote_log_size_bytes:sum", "job": "tierproxy-pipeline"}

        # Every rule of both files is loaded and has evaluated healthy.
        def evaluated() -> list[dict] | None:
            loaded = [rule for group in _get(f"{api}/rules")["data"]["groups"] for rule in group["rules"]]
            done = [rule for rule in loaded if rule["health"] == "ok" and rule["lastEvaluation"][:4] != "0001"]
            return loaded if len(done) == len(loaded) == len(rules()) else None

        loaded = _wait("every rule evaluated", evaluated, deadline, processes)
        assert {rule["name"] for rule in loaded} == {rule.get("alert") or rule["record"] for rule in rules()}
        # Nothing is wrong with this proxy and pipeline: no alert fires.
        firing = [a for a in _get(f"{api}/alerts")["data"]["alerts"] if a["state"] == "firing"]
        assert not firing, firing

        for expression in expressions():
            query(expression)  # the dashboard's queries parse and run

        # What the pipeline serves is documented, and has no _created series.
        text = _get(f"http://127.0.0.1:{pipeline_metrics}/metrics")
        samples = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
        assert {n for n in samples if n.startswith("tierproxy_")} <= metric_samples()
        assert "tierproxy_remote_copy_lag_bytes" in samples and not [n for n in samples if n.endswith("_created")]
    finally:
        stop_pids([p.pid for p in processes.values()])
        for log in logs.values():
            log.close()
    for name in ("serve", "tier"):
        assert "Traceback" not in (tmp_path / f"{name}.log").read_text(), name
