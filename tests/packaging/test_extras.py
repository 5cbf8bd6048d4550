"""`pip install kafka-tierproxy` is the proxy: no Spark, pandas, Arrow or librdkafka.

The extras of pyproject.toml bring the rest: `[pipeline]` for `tierproxy tier`,
`[loadtest]` for `tierproxy loadtest`, `[test]` for everything the tests need. Without
an extra, every module of the proxy's layers still imports, and the command that needs
the extra says in one line which one to install.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from importlib.machinery import EXTENSION_SUFFIXES
from importlib.metadata import requires
from pathlib import Path

import pytest

from tierproxy.cli import EXTRAS

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]

# Distributions only the extras may bring, and the modules they provide.
NOT_IN_CORE = {"pyspark", "pandas", "pyarrow", "confluent-kafka"}
BLOCKED_MODULES = ("pyspark", "py4j", "pandas", "pyarrow", "confluent_kafka")
# The proxy's layers (every module) and the commands the proxy image runs.
CORE_PACKAGES = ("protocol", "config", "client", "storage", "cache", "remote_log", "proxy")  # folders; tierproxy.<folder>
CORE_COMMANDS = ("tierproxy", "tierproxy.cli", "tierproxy.serve", "tierproxy.status", "tierproxy.config_check")


def _module_name(path: Path) -> str:
    """The module a source or compiled file is (`_fetch_wire.cpython-311-x86_64-linux-gnu.so`: `_fetch_wire`)."""
    return path.name.split(".")[0]


def _name(requirement: str) -> str:
    """The normalized distribution name of a PEP 508 requirement."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def _extras_of(requirement: str) -> set[str]:
    match = re.match(r"\s*[A-Za-z0-9][A-Za-z0-9._-]*\s*\[([^\]]*)\]", requirement)
    return {e.strip() for e in match.group(1).split(",")} if match else set()


def _blocked(script: str) -> str:
    """`script` run after making the extras' modules unimportable."""
    return f"import sys\nsys.modules.update(dict.fromkeys({BLOCKED_MODULES!r}))\n" + textwrap.dedent(script)


def _run(script: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _blocked(script)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


# --------------------------------------------------------------------------- pyproject.toml


def test_the_core_dependencies_are_the_proxys_only():
    core = {_name(r) for r in PROJECT["dependencies"]}
    assert not core & NOT_IN_CORE, sorted(core & NOT_IN_CORE)
    assert {"kio", "aiokafka", "aiobotocore", "uvloop", "cachetools", "prometheus-client", "javaproperties",
            "crc32c"} <= core


def test_the_installed_metadata_has_the_same_core():
    """What pip actually resolved for this (editable) install, not just the file."""
    installed = requires("kafka-tierproxy") or []
    core = {_name(r) for r in installed if "extra ==" not in r.replace("extra==", "extra ==")}
    assert core == {_name(r) for r in PROJECT["dependencies"]}


def test_the_extras():
    extras = {name: {_name(r) for r in reqs} for name, reqs in PROJECT["optional-dependencies"].items()}
    assert {"pyspark", "pyarrow", "pandas"} <= extras["pipeline"]
    assert any(_name(r) == "pandas" and "<3" in r for r in PROJECT["optional-dependencies"]["pipeline"])
    assert "confluent-kafka" in extras["loadtest"]
    # [test] is everything: both extras by self-reference, and the compose schema check.
    (itself,) = [r for r in PROJECT["optional-dependencies"]["test"] if _name(r) == "kafka-tierproxy"]
    assert _extras_of(itself) == {"pipeline", "loadtest"}
    assert "check-jsonschema" in extras["test"]


def test_the_commands_name_the_extras_of_pyproject():
    """tierproxy.cli.EXTRAS (what `tier` and `loadtest` check for) matches the extras."""
    for extra, modules in EXTRAS.items():
        declared = {_name(r) for r in PROJECT["optional-dependencies"][extra]}
        assert {_name(d) for d in modules.values()} <= declared, extra


def test_the_license_is_an_spdx_expression():
    assert PROJECT["license"] == "Apache-2.0"


# --------------------------------------------------------------------------- without the extras


def test_every_module_of_the_proxy_imports_without_the_extras(tmp_path):
    result = _run(f"""
        import importlib, json, pkgutil, traceback
        failed, imported = {{}}, []
        def attempt(name):
            try:
                importlib.import_module(name)
                imported.append(name)
            except BaseException:
                failed[name] = traceback.format_exc(limit=-3)
        for package in ["tierproxy." + p for p in {CORE_PACKAGES!r}]:
            attempt(package)
            module = sys.modules.get(package)
            for info in pkgutil.walk_packages(module.__path__, package + ".", onerror=attempt):
                attempt(info.name)
        for name in {CORE_COMMANDS!r}:
            attempt(name)
        print(json.dumps({{"failed": failed, "imported": imported}}))
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert not report["failed"], "\n".join(f"{name}:\n{error}" for name, error in report["failed"].items())
    # Every module of the layers' files was really walked, not just the packages (the
    # compiled accelerators built in place too).
    on_disk = {"tierproxy." + ".".join(path.relative_to(ROOT).parent.parts + (_module_name(path),))
               for package in CORE_PACKAGES for path in (ROOT / package).rglob("*")
               if path.name.endswith((".py", *EXTENSION_SUFFIXES))}
    on_disk = {name.removesuffix(".__init__") for name in on_disk}
    assert on_disk | set(CORE_COMMANDS) == set(report["imported"])


@pytest.mark.parametrize(("argv", "extra"), [
    (["tier"], "pipeline"),
    (["tier", "--every", "30s"], "pipeline"),
    (["loadtest", "--bootstrap", "127.0.0.1:1", "--topic", "t"], "loadtest"),
])
def test_a_command_without_its_extra_says_which_to_install(tmp_path, argv, extra):
    result = _run(f"""
        from tierproxy.cli import main
        sys.exit(main({argv!r}))
    """, tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"tierproxy {argv[0]}: ")
    assert f"pip install 'kafka-tierproxy[{extra}]'" in lines[0]
    assert result.stdout == ""


def test_the_installed_command_without_pyspark(tmp_path):
    """The console script itself (`tierproxy tier`), through runpy so the block applies."""
    result = _run("""
        import runpy
        sys.argv = ["tierproxy", "tier"]
        runpy.run_module("tierproxy", run_name="__main__")
    """, tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == "tierproxy tier: pyspark is not installed: pip install 'kafka-tierproxy[pipeline]'"
