"""`tierproxy config check --connect` tries the brokers and the object store and says in
one line each what is wrong; `tierproxy serve` checks the store at start, logs one
WARNING line naming it when it cannot be reached, and serves anyway."""

from __future__ import annotations

import subprocess
from pathlib import Path

from testbed.ports import free_port, free_ports
from tests.helpers.commands import TIERPROXY, wait_listening, write_properties


def _connect(properties: Path) -> tuple[int, dict[str, str], str]:
    """(exit status, {"brokers": line, "remote storage": line}, stderr) of `config check --connect`."""
    done = subprocess.run([str(TIERPROXY), "config", "check", "--config", str(properties), "--connect"],
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    found = {}
    for prefix in ("brokers ", "remote storage "):
        (line,) = [line for line in lines if line.startswith(prefix)]
        found[prefix.strip()] = line
    return done.returncode, found, done.stderr


def test_connect_says_ok_for_a_reachable_cluster_and_store(kafka_cluster, s3_server, tmp_path):
    local = write_properties(tmp_path / "local.properties", {
        "bootstrap.servers": kafka_cluster.bootstrap_servers,
        "remote.log.storage.local.dir": str(tmp_path / "remote" / "not-yet-created"),
    })
    status, lines, _ = _connect(local)
    assert status == 0
    assert lines["brokers"] == f"brokers {kafka_cluster.bootstrap_servers} (PLAINTEXT): ok"
    assert lines["remote storage"] == f"remote storage {tmp_path / 'remote' / 'not-yet-created'} (local): ok"

    s3 = write_properties(tmp_path / "s3.properties", {"bootstrap.servers": kafka_cluster.bootstrap_servers,
                                             **s3_server.storage_properties("probe")})
    status, lines, _ = _connect(s3)
    assert status == 0
    assert lines["remote storage"] == (
        f"remote storage s3://{s3_server.bucket}/probe at {s3_server.endpoint_url}: ok")


def test_connect_names_what_is_wrong_one_line_each(kafka_cluster, s3_server, tmp_path):
    broker, endpoint = free_ports(2)
    down = write_properties(tmp_path / "down.properties", {
        "bootstrap.servers": f"127.0.0.1:{broker}",
        **s3_server.storage_properties(endpoint_url=f"http://127.0.0.1:{endpoint}"),
    })
    status, lines, _ = _connect(down)
    assert status == 1
    assert lines["brokers"].startswith(f"brokers 127.0.0.1:{broker} (PLAINTEXT): ")
    assert f"cannot connect to broker 127.0.0.1:{broker}" in lines["brokers"]
    assert lines["remote storage"].startswith(f"remote storage s3://{s3_server.bucket}/ at http://127.0.0.1:{endpoint}: ")
    assert "Could not connect to the endpoint URL" in lines["remote storage"]

    no_bucket = write_properties(tmp_path / "no-bucket.properties", {
        "bootstrap.servers": kafka_cluster.bootstrap_servers,
        **s3_server.storage_properties(), "remote.log.storage.s3.bucket": "no-such-bucket",
    })
    status, lines, _ = _connect(no_bucket)
    assert status == 1
    assert lines["brokers"].endswith(": ok")
    assert "NoSuchBucket" in lines["remote storage"] and "s3://no-such-bucket" in lines["remote storage"]

    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    not_dir = write_properties(tmp_path / "file.properties", {"bootstrap.servers": kafka_cluster.bootstrap_servers,
                                                    "remote.log.storage.local.dir": str(a_file / "remote")})
    status, lines, _ = _connect(not_dir)
    assert status == 1
    assert lines["remote storage"] == f"remote storage {a_file / 'remote'} (local): {a_file} is not a directory"


def test_connect_logs_in_as_configured(secure_kafka, tmp_path):
    good = secure_kafka.tierproxy_properties(mechanism="SCRAM-SHA-512")
    storage = {"remote.log.storage.local.dir": str(tmp_path / "remote")}
    status, lines, _ = _connect(write_properties(tmp_path / "good.properties", {**good, **storage}))
    assert status == 0 and lines["brokers"].endswith("(SASL_SSL): ok"), lines
    wrong = write_properties(tmp_path / "wrong.properties", {**good, **storage, "sasl.password": "not-the-password"})
    status, lines, _ = _connect(wrong)
    assert status == 1
    assert "sasl.password" in lines["brokers"] and "not-the-password" not in lines["brokers"], lines["brokers"]


def _serve_until_listening(properties: Path, port: int) -> str:
    """Starts `tierproxy serve`, waits until it listens, stops it; returns its stderr."""
    process = subprocess.Popen([str(TIERPROXY), "serve", "--config", str(properties)], stderr=subprocess.PIPE,
                               text=True)
    try:
        wait_listening(port, process)
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    return stderr


def test_serve_reports_an_unreachable_store_at_start_and_serves(kafka_cluster, s3_server, tmp_path):
    proxy, node = free_ports(2)
    common = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "proxy.bootstrap.port": str(proxy),
              "proxy.broker.port.base": str(node), "metrics.port": "0", "proxy.workers": "1",
              "remote.log.metadata.dir": str(tmp_path / "metadata")}
    endpoint = f"http://127.0.0.1:{free_port()}"
    outage = write_properties(tmp_path / "outage.properties", {**common, **s3_server.storage_properties(endpoint_url=endpoint)})
    stderr = _serve_until_listening(outage, proxy)
    warnings = [line for line in stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 1, stderr
    assert f"remote storage s3://{s3_server.bucket}/ at {endpoint} cannot be reached: " in warnings[0]
    assert "Could not connect to the endpoint URL" in warnings[0]
    assert "Traceback" not in stderr

    reachable = write_properties(tmp_path / "reachable.properties", {**common, **s3_server.storage_properties()})
    stderr = _serve_until_listening(reachable, proxy)
    assert " WARNING " not in stderr, stderr
