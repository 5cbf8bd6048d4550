"""python -m testbed up / status / down, end to end, as separate processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import probe
from testbed.jars import KAFKA_VERSION
from testbed.processes import is_alive, pids_running
from tests.helpers.testbed_cli import run_testbed, up


@pytest.mark.broker
@pytest.mark.s3
def test_up_status_down_leaves_no_processes(tmp_path: Path) -> None:
    state_path, started = up(tmp_path, "--s3", "-c", "log.retention.ms=-1")
    try:
        assert started.returncode == 0, started.stderr
        state = json.loads(state_path.read_text())
        assert json.loads(started.stdout) == state
        [broker] = state["kafka"]["brokers"]
        assert state["kafka"]["bootstrap_servers"] == f"127.0.0.1:{broker['port']}"
        # `up` has exited; the servers it started keep running.
        assert probe.answers("127.0.0.1", broker["port"])
        assert "log.retention.ms=-1" in (
            Path(state["workdir"]) / "kafka" / "node-0" / "server.properties").read_text()

        again = run_testbed(state_path, "up")
        assert again.returncode == 1 and "already up" in again.stderr

        shown = run_testbed(state_path, "status")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        report = json.loads(shown.stdout)
        assert report["kafka"]["brokers"][0]["alive"] is True
        assert report["kafka"]["brokers"][0]["answers_api_versions"] is True
        assert report["s3"]["alive"] is True and report["s3"]["answers_http"] is True
    finally:
        stopped = run_testbed(state_path, "down")
    assert stopped.returncode == 0, stopped.stderr
    pids = [broker["pid"], state["s3"]["pid"]]
    assert not any(is_alive(pid) for pid in pids)
    assert pids_running(str(tmp_path)) == []
    assert not state_path.exists() and not Path(state["workdir"]).exists()

    after = run_testbed(state_path, "status")
    assert after.returncode == 1 and "not up" in after.stdout
    assert run_testbed(state_path, "down").returncode == 0


@pytest.mark.broker
def test_status_reports_a_dead_broker(tmp_path: Path) -> None:
    state_path, started = up(tmp_path)
    assert started.returncode == 0, started.stderr
    try:
        [broker] = json.loads(state_path.read_text())["kafka"]["brokers"]
        subprocess.run(["kill", "-KILL", str(broker["pid"])], check=True)
        deadline = time.monotonic() + 10
        while is_alive(broker["pid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        shown = run_testbed(state_path, "status")
        assert shown.returncode == 1
        assert json.loads(shown.stdout)["kafka"]["brokers"][0]["alive"] is False
    finally:
        assert run_testbed(state_path, "down").returncode == 0
    assert pids_running(str(tmp_path)) == []


def test_jars_command_reports_the_cached_jars() -> None:
    out = subprocess.run([sys.executable, "-m", "testbed", "jars"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"Apache Kafka {KAFKA_VERSION}:" in out.stdout
