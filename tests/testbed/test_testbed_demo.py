"""`make demo` (the README's run command) works end to end: Kafka, tierproxy tier, serve;
and `make demo-secure`, the same with SASL_SSL, SCRAM and TLS everywhere."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# testbed/ is the checkout's own (not installed): the demo runs in a scratch directory
# with the repository on its path, as `make demo` has it from the repository's root.
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("secure", [False, True], ids=["plaintext", "secure"])
def test_demo_reads_remote_and_local_records_through_the_proxy(tmp_path, secure):
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(REPO)}
    keep = tmp_path / "kept"
    command = [sys.executable, "-m", "testbed.demo", "--records", "3000", "--keep", str(keep)]
    result = subprocess.run(command + (["--secure"] if secure else []), cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = re.search(r"consumed (\d+) records through the proxy: (\d+) from the remote tier, (\d+) from the broker",
                      result.stdout)
    assert found, result.stdout[-3000:]
    assert tuple(map(int, found.groups())) == (4000, 3000, 1000)
    assert "every produced record exactly once: yes" in result.stdout
    assert "Traceback" not in (keep / "proxy.log").read_text()  # it stopped cleanly, too
    properties = (keep / "tierproxy.properties").read_text()
    if secure:
        assert "security.protocol=SASL_SSL" in properties and "remote.log.metadata.backend=topic" in properties
        assert "SASL_SSL" in result.stdout
        # The secret is in the file, never in what the commands print.
        assert "admin-secret" in properties and "admin-secret" not in result.stdout + result.stderr
