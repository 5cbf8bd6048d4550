"""The wheel a user installs: distribution `kafka-tierproxy`, command `tierproxy`, and
nothing in site-packages but the `tierproxy` package (every layer beneath it, the compiled
accelerators where a compiler built them) and its metadata. testbed/ stays in the checkout."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# folders installed as tierproxy.<folder>
LAYERS = ("protocol", "config", "client", "storage", "cache", "remote_log", "proxy", "pipeline")
# The compiled accelerators (setup.py): built here, as where `pip install` found a compiler.
EXTENSIONS = ("tierproxy.protocol._fetch_wire", "tierproxy.pipeline._record_arrays")
BUILT = all(importlib.util.find_spec(name) is not None for name in EXTENSIONS)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of what the wheel is made of, so that no build/ folder left in the
    checkout (setuptools builds in the source tree) can add files that are gone."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in set(PYPROJECT["tool"]["setuptools"]["package-dir"].values()):
        # Not the editable install's compiled modules either: the wheel's are its own build.
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
                   check=True, capture_output=True, timeout=300)
    (built,) = out.glob("*.whl")
    return built


def test_the_distribution_name_is_ours():
    # "tierproxy" on the package index is another project's.
    assert PYPROJECT["project"]["name"] == "kafka-tierproxy"
    assert PYPROJECT["project"]["scripts"] == {"tierproxy": "tierproxy.cli:main"}


def test_the_wheel_holds_only_the_tierproxy_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"tierproxy", "kafka_tierproxy-0.1.0.dist-info"}, tops
    modules = {name for name in names if name.endswith(".py")}
    expected = {f"tierproxy/{path.relative_to(ROOT / 'tierproxy')}" for path in (ROOT / "tierproxy").rglob("*.py")}
    for folder in LAYERS:
        expected |= {f"tierproxy/{folder}/{path.relative_to(ROOT / folder)}" for path in (ROOT / folder).rglob("*.py")}
    assert modules == expected, sorted(modules ^ expected)
    assert not any(name.startswith(("testbed", "tests", "benchmarks")) for name in names)
    compiled = {name for name in names if name.endswith((".so", ".pyd"))}
    wanted = {name.replace(".", "/") for name in EXTENSIONS} if BUILT else set()
    assert {name.split(".")[0] for name in compiled} == wanted, compiled


def test_installed_into_a_fresh_venv(wheel, tmp_path):
    """Installed without its dependencies into a new venv: the names it adds to site-packages,
    and the command and layers importing from there (dependencies from this venv's
    site-packages, read without its .pth files, so no editable finder can answer)."""
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    before = {p.name for p in site.iterdir()}
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    added = {p.name for p in site.iterdir()} - before
    assert added == {"tierproxy", "kafka_tierproxy-0.1.0.dist-info"}, added
    assert (env / "bin" / "tierproxy").exists()

    dependencies = sysconfig.get_paths()["purelib"]
    extensions = list(EXTENSIONS) if BUILT else []
    check = f"""
import importlib, json, sys
sys.path[:] = [{str(site)!r}, *sys.path, {dependencies!r}]
import tierproxy.cli, tierproxy.proxy.serve, tierproxy.pipeline.tier, tierproxy.storage.rsm
from tierproxy.protocol import fetch_wire
modules = ["tierproxy", "tierproxy.proxy.serve", "tierproxy.storage.rsm", *{extensions!r}]
print(json.dumps({{m: importlib.import_module(m).__file__ for m in modules}}))
assert fetch_wire.COMPILED == {BUILT!r}, "the compiled walks are not the ones in use"
"""
    env = {k: v for k, v in os.environ.items() if k != "TIERPROXY_NO_EXTENSIONS"}
    result = subprocess.run([str(python), "-S", "-c", check], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    files = json.loads(result.stdout)
    assert all(Path(f).is_relative_to(site) for f in files.values()), files
