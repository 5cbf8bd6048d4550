"""Running the `tierproxy` command in tests: where it is, the environment its Spark jobs
need, its properties files, and waiting for `serve` to listen."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import javaproperties

TIERPROXY = Path(sys.executable).parent / "tierproxy"
# Spark's Python workers run this interpreter, on loopback, without the web UI.
SPARK_ENV = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
             "PYSPARK_SUBMIT_ARGS": "--conf spark.ui.enabled=false pyspark-shell"}


def write_properties(path: Path, values: Mapping[str, str]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        javaproperties.dump(dict(values), f, timestamp=False)
    return path


def wait_listening(port: int, process: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Returns once 127.0.0.1:`port` accepts connections; fails if `process` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the command exited with {process.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing listened on {port} within {timeout_s:.0f} s")
