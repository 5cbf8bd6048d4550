"""`make demo` (the README's run command) works end to end: Kafka, tierproxy tier, serve."""

import os
import re
import subprocess
import sys

import pytest


@pytest.mark.timeout(600)
def test_demo_reads_remote_and_local_records_through_the_proxy(tmp_path):
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    result = subprocess.run([sys.executable, "-m", "testbed.demo", "--records", "3000"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = re.search(r"consumed (\d+) records through the proxy: (\d+) from the remote tier, (\d+) from the broker",
                      result.stdout)
    assert found, result.stdout[-3000:]
    assert tuple(map(int, found.groups())) == (4000, 3000, 1000)
    assert "every produced record exactly once: yes" in result.stdout
