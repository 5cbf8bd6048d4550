"""`tierproxy serve` as its own process in a test: started over a properties file, its
output read on a thread, its metrics endpoint scraped."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import pytest

from testbed.ports import LOOPBACK
from tests.helpers.commands import TIERPROXY, write_properties


class Served:
    """A `tierproxy serve` subprocess and its output, read on a thread."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, count: int = 1, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(re.findall(pattern, self.output)) < count:
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no {count} x {pattern!r} from tierproxy serve:\n{self.output}")
            time.sleep(0.1)

    def workers(self) -> set[int]:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return {int(pid) for pid in children.read_text().split()} if children.exists() else set()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(10)
        return self.process.returncode


def start_serving(settings: Mapping[str, object], directory: Path, *arguments: str) -> Served:
    """`tierproxy serve` over a properties file of `settings`, written to `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    config = write_properties(directory / "proxy.properties", {key: str(value) for key, value in settings.items()})
    return Served([str(TIERPROXY), "serve", "--config", str(config), *arguments])


def scrape(metrics_port: int) -> str:
    """The metrics endpoint's exposition."""
    with urllib.request.urlopen(f"http://{LOOPBACK}:{metrics_port}/metrics", timeout=10) as response:
        return response.read().decode()


def sample(exposition: str, name: str) -> float:
    """The samples of `name` (any labels, or those given in it) added up."""
    return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", exposition, re.M))
