"""The top-level folders are the importable packages, and they come from this repository."""

import importlib
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ["tierproxy", "config", "client", "proxy", "protocol", "storage", "cache", "pipeline", "testbed"]


@pytest.mark.parametrize("name", PACKAGES)
def test_package_resolves_to_this_repository(name):
    module = importlib.import_module(name)
    assert pathlib.Path(module.__file__).resolve().parent == REPO / name


@pytest.mark.parametrize("name", PACKAGES)
def test_package_resolves_from_another_directory(name, tmp_path):
    """Installed (editable) resolution, not just the test runner's sys.path."""
    out = subprocess.run(
        [sys.executable, "-c", f"import {name}; print({name}.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert pathlib.Path(out).resolve().parent == REPO / name


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
