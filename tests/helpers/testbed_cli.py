"""`python -m testbed` (up, status, down) as its own process, as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_testbed(state: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m testbed --state STATE ARGS`, finished."""
    return subprocess.run([sys.executable, "-m", "testbed", "--state", str(state), *args],
                          capture_output=True, text=True, timeout=120)


def up(directory: Path, *args: str) -> tuple[Path, subprocess.CompletedProcess]:
    """`up ARGS` with its state file in `directory`: (the state file, the finished command)."""
    state = directory / "state.json"
    return state, run_testbed(state, "up", *args)
