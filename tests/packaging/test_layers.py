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


def module_imports(source: pathlib.Path) -> set[str]:
    """Absolute names of what a module imports when it is imported: statements at its top
    level (inside `try`/`if` too), not in functions and not under `if TYPE_CHECKING:`;
    `from x import y` gives x and x.y (y may be a module)."""
    parts = source.relative_to(REPO).with_suffix("").parts
    package = ["tierproxy", *parts[:-1]] if parts[0] != "tierproxy" else list(parts[:-1])
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                name = ".".join([*base, *([node.module] if node.module else [])])
                found.add(name)
                found.update(f"{name}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
    visit(ast.parse(source.read_text(), str(source)).body)
    return found


def installed_name(source: pathlib.Path) -> str:
    parts = source.relative_to(REPO).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts if parts[0] == "tierproxy" else ("tierproxy", *parts))


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of `graph` (module -> the modules it imports), one path each."""
    cycles, state = [], {}

    def walk(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                walk(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    return cycles


def test_no_module_imports_itself_back():
    """No import cycle among the installed modules (a cycle works or breaks by import
    order; `proxy.client_connection` and `proxy.server` once formed one)."""
    sources = [s for package in sorted(OURS - {"testbed"}) for s in (REPO / package).rglob("*.py")]
    names = {installed_name(source): source for source in sources}
    graph = {name: {target for target in module_imports(source) if target in names and target != name}
             for name, source in names.items()}
    # A package's __init__ runs first when any of its modules is imported: `from . import x`
    # inside it is an edge, a module importing its own package's __init__ is not.
    graph = {name: {t for t in targets if not name.startswith(t + ".")} for name, targets in graph.items()}
    assert not import_cycles(graph), "\n".join(" -> ".join(cycle) for cycle in import_cycles(graph))


def test_the_cycle_check_sees_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
