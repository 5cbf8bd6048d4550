"""`benchmarks/profiling.py`: py-spy records a process that runs a known function, and the
summary puts that function on top."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from benchmarks.profiling import format_summary, record, summarize

SPIN = textwrap.dedent("""
    import time

    def spin_in_python():
        total = 0
        for i in range(100_000):
            total += i
        return total

    end = time.monotonic() + 20
    while time.monotonic() < end:
        spin_in_python()
""")


def test_a_recorded_process_shows_its_hot_function_on_top(tmp_path: Path):
    process = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        time.sleep(0.3)
        with record(process.pid, tmp_path / "spin.raw", rate=200) as out:
            time.sleep(1.5)
    finally:
        process.kill()
        process.wait()
    samples, shares = summarize(out)
    assert samples > 0
    top = max(shares, key=lambda share: share.self_samples)
    assert top.function.startswith("spin_in_python ")
    assert top.self_samples > samples / 2
    assert "spin_in_python" in format_summary(samples, shares, top=3).splitlines()[1]


def test_the_summary_counts_self_and_total_per_function(tmp_path: Path):
    raw = tmp_path / "profile.raw"
    raw.write_text("process 7:\"serve\";<module> (/x/a.py:1);outer (/x/a.py:5);inner (/x/a.py:9) 3\n"
                   "process 7:\"serve\";<module> (/x/a.py:1);outer (/x/a.py:6) 1\n"
                   "<module> (/x/a.py:1);inner (/x/a.py:10) 2\n")
    samples, shares = summarize(raw)
    by_name = {share.function.split(" ")[0]: share for share in shares}
    assert samples == 6
    assert (by_name["inner"].self_samples, by_name["inner"].total_samples) == (5, 5)
    assert (by_name["outer"].self_samples, by_name["outer"].total_samples) == (1, 4)
    assert (by_name["<module>"].self_samples, by_name["<module>"].total_samples) == (0, 6)
