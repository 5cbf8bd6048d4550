"""The packages import from this repository's folders, under `tierproxy.`; testbed/ is the
checkout's own (it is not installed) and resolves from the repository root."""

import importlib
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
# module -> the folder it comes from
PACKAGES = {
    "tierproxy": "tierproxy",
    **{f"tierproxy.{folder}": folder
       for folder in ("config", "client", "proxy", "protocol", "storage", "cache", "remote_log", "pipeline")},
}


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_package_resolves_to_this_repository(name):
    module = importlib.import_module(name)
    assert pathlib.Path(module.__file__).resolve().parent == REPO / PACKAGES[name]


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_package_resolves_from_another_directory(name, tmp_path):
    """Installed (editable) resolution, not just the test runner's sys.path."""
    out = subprocess.run(
        [sys.executable, "-c", f"import {name}; print({name}.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert pathlib.Path(out).resolve().parent == REPO / PACKAGES[name]


def test_testbed_runs_from_the_checkout():
    out = subprocess.run([sys.executable, "-c", "import testbed; print(testbed.__file__)"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    assert pathlib.Path(out).resolve().parent == REPO / "testbed"


def test_console_script_is_installed():
    script = pathlib.Path(sys.executable).parent / "tierproxy"
    assert script.exists()
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("tierproxy ")


def test_help_lists_the_security_keys():
    script = pathlib.Path(sys.executable).parent / "tierproxy"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True).stdout
    for key in ("security.protocol", "sasl.mechanism", "sasl.jaas.config", "ssl.truststore.location",
                "ssl.keystore.location", "ssl.endpoint.identification.algorithm"):
        assert key in out, key
    assert "SCRAM-SHA-512" in out and "SASL_SSL" in out
