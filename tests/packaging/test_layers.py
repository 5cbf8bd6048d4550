"""Imports go only downwards through the layers of the README's map:

    protocol                      the wire, no I/O
    config, client                declarations; tierproxy's own Kafka client
    storage, cache                remote segments and metadata; the caches
    remote_log                    the remote read side (Kafka's RemoteLogManager read path)
    proxy | pipeline              the two services (neither imports the other)
    tierproxy                     the command

Installed, each folder is `tierproxy.<folder>` (the command is `tierproxy` itself).
testbed (real Kafka and S3 for tests, benchmarks and the demo) sits beside the stack
and may run the command; no package of the stack imports it. Every module's imports
are read from its source, including those inside functions, so a lazy import cannot
hide an upward one.
"""

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# package -> the packages of tierproxy it may import (besides itself)
MAY_IMPORT: dict[str, set[str]] = {
    "protocol": set(),
    "config": set(),
    "client": {"protocol", "config"},
    "storage": {"protocol", "config", "client"},
    "cache": {"protocol", "config", "client", "storage"},
    "remote_log": {"protocol", "config", "client", "storage", "cache"},
    "proxy": {"protocol", "config", "client", "storage", "cache", "remote_log"},
    "pipeline": {"protocol", "config", "client", "storage", "cache", "remote_log"},
    "tierproxy": {"protocol", "config", "client", "storage", "cache", "remote_log", "proxy", "pipeline"},
    "testbed": {"protocol", "config", "client", "storage", "cache", "remote_log", "proxy", "pipeline", "tierproxy"},
}
OURS = set(MAY_IMPORT)


def layer_of(module: str) -> str | None:
    """The layer of an absolute module name: `tierproxy.proxy.server` is proxy,
    `tierproxy.cli` the command, `testbed.kafka` testbed; None for others' modules."""
    parts = module.split(".")
    if parts[0] == "testbed":
        return "testbed"
    if parts[0] != "tierproxy":
        return None
    if len(parts) > 1 and parts[1] in OURS:
        return parts[1]
    return "tierproxy"


def imported_packages(source: pathlib.Path, package: str) -> set[tuple[str, int]]:
    """(layer of ours, line) for every import in the file."""
    found = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names = []  # relative: within its own package
            else:
                module = node.module or ""
                # `from tierproxy import proxy` names the subpackage
                names = [f"{module}.{alias.name}" if module == "tierproxy" else module for alias in node.names]
        else:
            continue
        for name in names:
            layer = layer_of(name)
            if layer is not None and layer != package:
                found.add((layer, node.lineno))
    return found


def test_every_top_level_package_has_a_layer():
    folders = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    assert folders == OURS


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_imports_go_only_downwards(package):
    sources = sorted((REPO / package).rglob("*.py"))
    assert sources, package
    upward = [
        f"{source.relative_to(REPO)}:{line} imports {top}"
        for source in sources
        for top, line in sorted(imported_packages(source, package))
        if top != package and top not in MAY_IMPORT[package]
    ]
    assert not upward, "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    """The check is not vacuous: a storage module importing proxy is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from tierproxy.proxy.server import ProxyServer\n"
                   "import tierproxy.cli\nfrom tierproxy import pipeline\n")
    assert imported_packages(bad, "storage") == {("proxy", 2), ("tierproxy", 3), ("pipeline", 4)}
