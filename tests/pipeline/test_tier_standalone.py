"""`tierproxy tier` on a Spark standalone cluster (a master and one worker on loopback,
started with pyspark's own `spark-class`), not only local[*]."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from testbed.ports import free_ports
from testbed.processes import log_tail, spawn, stop_pids
from tests.helpers.commands import SPARK_ENV, TIERPROXY, write_properties
from tests.helpers.produce import produce_mixed
from tests.helpers.pipeline import BROKER_SEGMENT_BYTES, check_remote_log, tier_config

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


def _wait_for(url: str, text: str, log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if text in response.read().decode(errors="replace"):
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not show {text!r} within {timeout}s:\n{log_tail(log)}")


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(spark://127.0.0.1:<port>, master web UI port) with one 1-core worker; both stopped by pid."""
    work = tmp_path_factory.mktemp("spark-standalone")
    port, ui, worker_ui = free_ports(3)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(work / "logs"),
           "PYSPARK_PYTHON": sys.executable}
    master_url = f"spark://127.0.0.1:{port}"
    pids = []
    try:
        master = spawn([str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                        "--port", str(port), "--webui-port", str(ui)], work / "master.log", env=env)
        pids.append(master.pid)
        _wait_for(f"http://127.0.0.1:{ui}/json/", '"status" : "ALIVE"', work / "master.log")
        worker = spawn([str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", master_url, "--host",
                        "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(worker_ui),
                        "--work-dir", str(work / "worker")], work / "worker.log", env=env)
        pids.append(worker.pid)
        _wait_for(f"http://127.0.0.1:{ui}/json/", '"aliveworkers" : 1', work / "worker.log")
        yield master_url, ui
    finally:
        stop_pids(pids)


async def _tier_on(master_url: str, properties: Path, app_name: str) -> subprocess.CompletedProcess:
    """`tierproxy tier` with the file, on the standalone master; it must succeed."""
    done = await asyncio.to_thread(
        subprocess.run,
        [str(TIERPROXY), "tier", "--config", str(properties), "--override", f"spark.master={master_url}",
         "--override", f"spark.app.name={app_name}"],
        env=SPARK_ENV, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


async def _mixed_topic(kafka_cluster, topic, tmp_path: Path, partitions: int, per_codec: int,
                       per_transaction: int):
    """A topic of small broker segments with the mixed data set, its tiering configuration
    (32 KiB remote segments) and that in a file."""
    name = topic(partitions=partitions, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
    await produce_mixed(kafka_cluster.bootstrap_servers, name, partitions, per_codec=per_codec,
                        per_transaction=per_transaction)
    config = tier_config(tmp_path, kafka_cluster.bootstrap_servers, name, topic_settings={"segment.bytes": 32 * 1024})
    return name, config, write_properties(tmp_path / "tier.properties", config.raw())


def _completed_apps(ui: int) -> list[str]:
    """The applications the standalone master lists as completed, oldest first."""
    with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as response:
        return [app["name"] for app in json.load(response)["completedapps"]]


async def test_tier_command_runs_on_a_standalone_master(standalone, kafka_cluster, topic, tmp_path):
    name, config, properties = await _mixed_topic(kafka_cluster, topic, tmp_path, 2, 1_000, 50)

    master_url, ui = standalone
    done = await _tier_on(master_url, properties, "tierproxy-standalone-test")
    assert "2 partitions," in done.stdout  # the summary line
    # It ran on the standalone cluster: its master lists the application as completed.
    assert _completed_apps(ui) == ["tierproxy-standalone-test"]

    segments = await check_remote_log(config, name, tail_may_wait=True)
    assert all(len(s) >= 2 for s in segments.values())


async def test_spark_submit_runs_the_same_job(standalone, kafka_cluster, topic, tmp_path):
    """spark-submit with tierproxy/submit.py: the submitted master wins over the file's."""
    name, config, properties = await _mixed_topic(kafka_cluster, topic, tmp_path, 1, 500, 20)

    master_url, ui = standalone
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    entry = Path(__file__).resolve().parents[2] / "tierproxy" / "submit.py"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = await asyncio.to_thread(
        subprocess.run,
        [str(submit), "--master", master_url, "--name", "tierproxy-spark-submit", "--conf", "spark.ui.enabled=false",
         str(entry), "--config", str(properties)],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # config says local[*]; the job ran on the standalone master all the same.
    assert "tierproxy-spark-submit" in _completed_apps(ui)
    segments = await check_remote_log(config, name, tail_may_wait=True)
    assert segments and all(len(s) >= 1 for s in segments.values())


async def test_tier_command_on_a_standalone_master_over_sasl_ssl(standalone, secure_kafka, secure_topic, tmp_path):
    """The executors log in too: every copy task opens its own SASL_SSL connections."""
    from confluent_kafka import Producer

    name = secure_topic(partitions=2, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
    # Batches below the topic's 64 KiB broker segments, which refuse a larger one.
    producer = Producer({**secure_kafka.client_config(mechanism="SCRAM-SHA-512"), "linger.ms": 20,
                         "batch.size": 16_384})
    errors = []
    for i in range(4_000):
        producer.produce(name, key=b"%06d" % i, value=bytes(200), partition=i % 2,
                         on_delivery=lambda error, _: error and errors.append(error))
    assert producer.flush(30) == 0 and not errors, errors[:3]
    security = secure_kafka.tierproxy_properties(mechanism="SCRAM-SHA-512")
    config = tier_config(tmp_path, secure_kafka.bootstrap_servers, name, topic_settings={"segment.bytes": 32 * 1024},
                         extra=security)
    properties = write_properties(tmp_path / "tier.properties", config.raw())

    master_url, ui = standalone
    done = await _tier_on(master_url, properties, "tierproxy-standalone-sasl-ssl")
    assert security["sasl.password"] not in done.stdout + done.stderr
    assert "tierproxy-standalone-sasl-ssl" in _completed_apps(ui)
    segments = await check_remote_log(config, name, tail_may_wait=True)
    assert all(len(s) >= 2 for s in segments.values())
