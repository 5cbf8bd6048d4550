"""`benchmarks/adversarial.py`, small: bad frames, pre-authentication floods, slow, idle and
non-reading clients and a connection flood against a `tierproxy serve` in front of a SASL
broker. The proxy must stay up and answer, stay within its documented memory bound
with non-reading clients over remote data larger than its chunk cache, and a consumer
beside them must read every record."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "adversarial.py"
pytestmark = pytest.mark.timeout(600)


def test_hostile_clients_leave_the_proxy_and_its_other_clients_unharmed():
    run = subprocess.run([sys.executable, str(SCRIPT), "--mb", "24", "--bad-frames", "300", "--slow", "40",
                          "--floods", "10", "--over-limit", "10", "--seconds", "6"],
                         cwd=SCRIPT.parent, capture_output=True, text=True, timeout=540)
    out = run.stdout
    assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
    assert "proxy alive and answering: yes" in out
    assert "): within" in out, out
    consumed = re.search(r"side consumer: (\d+) of (\d+) records", out)
    assert consumed and consumed[1] == consumed[2] and int(consumed[2]) > 20_000, out
    for case in ("bad frames | 300 | 300", "pre-auth 100 MiB frames | 10 | 10", "slow and idle clients | 50 | 50",
                 "connections over max.connections.per.ip | 10 | 10"):
        assert case in out, out
