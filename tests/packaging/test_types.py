"""mypy, with the settings of pyproject.toml's [tool.mypy], finds no error in any installed
module: `tierproxy` and each layer under it (tierproxy/<layer> links to the folders).
Its cache (.mypy_cache/ in the checkout) makes the run after the first a matter of seconds."""

import os
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_mypy_finds_no_error() -> None:
    run = subprocess.run([sys.executable, "-m", "mypy", "-p", "tierproxy"], cwd=REPO, capture_output=True, text=True)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    # Every module of the wheel was checked: none is left out by a broken link or mapping.
    modules = [name for _, _, names in os.walk(REPO / "tierproxy", followlinks=True)
               for name in names if name.endswith(".py")]
    checked = re.search(r"(\d+) source files", output)
    assert checked is not None and int(checked.group(1)) == len(modules), output


def test_config_keys_give_their_type() -> None:
    # A ConfigKey[T] gives a T through Config[...] and Config.get, in whatever module reads it.
    program = "\n".join((
        "from tierproxy.config import BOOTSTRAP_SERVERS, METRICS_PORT, Config",
        "def read(config: Config) -> None:",
        "    servers: tuple[str, ...] = config[BOOTSTRAP_SERVERS]",
        "    port: int | None = config.get(METRICS_PORT)",
        "    count: int = config[BOOTSTRAP_SERVERS]",
        "    name: str = config.get(METRICS_PORT, '')",
    ))
    run = subprocess.run([sys.executable, "-m", "mypy", "-c", program], cwd=REPO, capture_output=True, text=True)
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["5", "6"], run.stdout
    assert '"tuple[str, ...]", variable has type "int"' in errors[0], run.stdout
    assert '"int | str", variable has type "str"' in errors[1], run.stdout
