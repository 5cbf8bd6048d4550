"""Sampling profiles of a running process with py-spy, and their top lines.

A benchmark records the proxy (its supervisor and every worker, `--subprocesses`) while a
case runs, with `record`, into py-spy's raw format (one line per distinct stack: the
frames from the outermost, `;`-separated, then the sample count). `summarize` turns such a
file into the lines a note quotes: per function, the share of samples where it is on top
of the stack (self) and anywhere on it (total).

    .venv/bin/python benchmarks/profiling.py proxy.raw          # the top 25 by self
    .venv/bin/python benchmarks/profiling.py proxy.raw --by total --top 40

py-spy is on PyPI (the test extra installs it); it reads another process's memory, so it
needs ptrace permission over it (kernel.yama.ptrace_scope 0, or the profiled process a
child of the recording one's parent, or root).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ("FunctionShare", "py_spy", "record", "summarize", "format_summary")

# "function (path/to/file.py:123)" or, for native frames without a file, "function".
_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def py_spy() -> str:
    """The py-spy executable beside this interpreter, else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy not found: install it with `pip install py-spy` (the test extra has it)")
    return found


@contextlib.contextmanager
def record(pid: int, out: Path, *, rate: int = 250, native: bool = False) -> Iterator[Path]:
    """Sample `pid` and its child processes at `rate` Hz while the block runs; the raw
    profile is in `out` once the block has left."""
    command = [py_spy(), "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
               "--output", str(out), "--subprocesses", "--nonblocking"]
    if native:
        command.append("--native")
    recorder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield out
    finally:
        # SIGINT makes py-spy stop sampling and write what it has.
        with contextlib.suppress(ProcessLookupError):
            recorder.send_signal(signal.SIGINT)
        try:
            _, errors = recorder.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            recorder.kill()
            _, errors = recorder.communicate()
        if not out.exists():
            raise RuntimeError(f"py-spy wrote no profile of pid {pid}: {errors.decode(errors='replace').strip()}")


@dataclass(frozen=True)
class FunctionShare:
    function: str  # "name (file)", the line left out so that a function's lines add up
    self_samples: int
    total_samples: int


def _function(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    file = match["file"]
    # Paths differ between machines and checkouts: keep the part a reader recognises.
    for marker in ("/site-packages/", "/lib/python"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    else:
        file = os.path.relpath(file) if os.path.isabs(file) else file
    return f"{match['function']} ({file})"


def summarize(raw: Path) -> tuple[int, list[FunctionShare]]:
    """Samples in all, and every function's self and total samples, from a raw profile."""
    own: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        samples += count
        functions = [_function(frame) for frame in stack.split(";")
                     if not frame.startswith(("process ", "thread "))]
        if not functions:
            continue
        own[functions[-1]] += count
        for function in set(functions):
            anywhere[function] += count
    shares = [FunctionShare(name, own[name], anywhere[name]) for name in anywhere]
    return samples, shares


def format_summary(samples: int, shares: list[FunctionShare], *, top: int = 25, by: str = "self") -> str:
    key = (lambda share: share.self_samples) if by == "self" else (lambda share: share.total_samples)
    lines = [f"{samples} samples; self% total% function (file)"]
    for share in sorted(shares, key=key, reverse=True)[:top]:
        lines.append(f"{100 * share.self_samples / max(samples, 1):5.1f} "
                     f"{100 * share.total_samples / max(samples, 1):6.1f}  {share.function}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", type=Path, help="a profile written by py-spy record --format raw")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--by", choices=("self", "total"), default="self")
    args = parser.parse_args()
    samples, shares = summarize(args.raw)
    print(format_summary(samples, shares, top=args.top, by=args.by))
    return 0


if __name__ == "__main__":
    sys.exit(main())
