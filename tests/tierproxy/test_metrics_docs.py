"""docs/metrics.md is what the metric declarations generate now, every family a running
proxy serves is in it, and no endpoint serves `_created` series."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from testbed.ports import free_ports
from tierproxy.metrics_docs import REGENERATE, declared_families, generate_metrics_docs
from tierproxy.pipeline.metrics import PipelineMetrics
from tierproxy.proxy.metrics import ProxyMetrics
from tests.helpers.commands import TIERPROXY, wait_listening

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "metrics.md"


def documented_samples() -> set[str]:
    return set(re.findall(r"`(tierproxy_[a-z0-9_]+)`", DOCS.read_text()))


def test_committed_reference_is_up_to_date():
    committed = DOCS.read_text() if DOCS.exists() else ""
    assert committed == generate_metrics_docs(), f"docs/metrics.md is out of date; regenerate it with: {REGENERATE}"


def test_the_command_prints_the_reference():
    done = subprocess.run([str(TIERPROXY), "config", "metrics"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == generate_metrics_docs()


def test_every_family_of_the_proxy_and_the_pipeline_is_documented_with_kafkas_name():
    families = {f.name: f for f in declared_families()}
    declared = {name.removesuffix("_total") for name in families}
    for registry in (ProxyMetrics().registry, PipelineMetrics().registry):
        for family in registry.collect():
            assert family.name in declared, family.name
    kafka = {name: f.kafka_name for name, f in families.items()}
    assert kafka["tierproxy_remote_copy_lag_bytes"] == "RemoteCopyLagBytes"
    assert kafka["tierproxy_remote_copy_lag_segments"] == "RemoteCopyLagSegments"
    assert kafka["tierproxy_remote_delete_lag_bytes"] == "RemoteDeleteLagBytes"
    assert kafka["tierproxy_remote_delete_lag_segments"] == "RemoteDeleteLagSegments"
    assert kafka["tierproxy_remote_log_size_bytes"] == "RemoteLogSizeBytes"
    assert kafka["tierproxy_remote_log_metadata_count"] == "RemoteLogMetadataCount"
    assert kafka["tierproxy_remote_copy_bytes"] == "RemoteCopyBytesPerSec"
    assert kafka["tierproxy_remote_copy_errors"] == "RemoteCopyErrorsPerSec"
    assert kafka["tierproxy_remote_delete_requests"] == "RemoteDeleteRequestsPerSec"
    assert kafka["tierproxy_remote_delete_errors"] == "RemoteDeleteErrorsPerSec"
    assert kafka["tierproxy_remote_copy_throttle_seconds"] == "remote-copy-throttle-time"
    # The five the operations guide never named are in the reference.
    for name in ("tierproxy_connections_total", "tierproxy_client_bytes_in_total", "tierproxy_client_bytes_out_total",
                 "tierproxy_remote_partitions_served_total", "tierproxy_cache_entries"):
        assert name in documented_samples(), name


def test_a_family_declared_in_any_form_is_found(tmp_path):
    from tierproxy.metrics_docs import _families_in

    module = tmp_path / "declares.py"
    module.write_text(
        "import prometheus_client\n"
        "from prometheus_client import Counter, Histogram\n"
        "a = prometheus_client.Gauge('tierproxy_a', 'A gauge.', ['x'], registry=None)\n"
        "b = Counter(name='ignored', documentation='no literal first argument')\n"
        "c = Histogram('tierproxy_c', documentation='A histogram '\n 'in two parts.', labelnames=('y', 'z'))\n"
        "d = Counter('other_d', 'Not ours.')\n")
    found = list(_families_in(module, "somewhere"))
    assert [(f.name, f.type, f.help, f.labels) for f in found] == [
        ("tierproxy_a", "gauge", "A gauge.", ("x",)),
        ("tierproxy_c", "histogram", "A histogram in two parts.", ("y", "z")),
    ]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_a_running_proxy_serves_only_documented_families_and_no_created_series(kafka_cluster, tmp_path):
    for workers in (1, 2):  # one process, and the supervisor's multiprocess endpoint
        proxy, node, metrics = free_ports(3)
        properties = tmp_path / f"proxy-{workers}.properties"
        properties.write_text(
            f"bootstrap.servers={kafka_cluster.bootstrap_servers}\nproxy.bootstrap.port={proxy}\n"
            f"proxy.broker.port.base={node}\nmetrics.port={metrics}\nproxy.workers={workers}\n"
            f"remote.log.storage.local.dir={tmp_path / 'remote'}\nremote.log.metadata.dir={tmp_path / 'metadata'}\n")
        process = subprocess.Popen([str(TIERPROXY), "serve", "--config", str(properties)], stderr=subprocess.DEVNULL)
        try:
            wait_listening(proxy, process)
            deadline = time.monotonic() + 30
            while "tierproxy_build_info" not in (text := _scrape(metrics)):  # workers write theirs when they start
                assert time.monotonic() < deadline, text
                time.sleep(0.2)
        finally:
            process.terminate()
            process.wait(60)
        samples = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
        ours = {name for name in samples if name.startswith("tierproxy_")}
        assert ours <= documented_samples(), sorted(ours - documented_samples())
        assert not [name for name in samples if name.endswith("_created")], text
        assert re.search(r'^tierproxy_build_info\{version="[^"]+"\} 1\.0$', text, re.M), text
