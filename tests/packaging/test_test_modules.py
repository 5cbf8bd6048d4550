"""The tests share their helpers through tests/helpers/ and plain modules beside them, never
through a test module: no module of the repository imports a `tests/**/test_*.py`, so that
a test module's fixtures and tests run once, under its own name, and moving one breaks no
other. Imports are read from the sources, inside functions too; relative ones are resolved.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

REPO = pathlib.Path(__file__).resolve().parents[2]
# Every folder of the repository holding Python: the tests, testbed, the benchmarks, the packages.
SOURCES = ("tests", "testbed", "benchmarks", "tierproxy", "protocol", "config", "client", "storage", "cache",
           "remote_log", "proxy", "pipeline")


def module_name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def imported(source: str, module: str) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in `source`, the text of `module`; `from a import b`
    yields a and a.b (b may be a module)."""
    package = module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join([*base, *([node.module] if node.module else [])])
            yield node.lineno, name
            for alias in node.names:
                yield node.lineno, f"{name}.{alias.name}"


def test_no_module_imports_a_test_module():
    test_modules = {module_name(path) for path in (REPO / "tests").rglob("test_*.py")}
    assert "tests.packaging.test_test_modules" in test_modules
    found = []
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            for line, name in imported(path.read_text(), module_name(path)):
                if name in test_modules:
                    found.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not found, "shared helpers belong in tests/helpers/:\n" + "\n".join(found)


def test_relative_and_nested_imports_are_seen():
    source = ("from .test_passthrough import proxy\n"
              "from ..helpers import proxy as helpers\n"
              "from . import test_channel\n"
              "def later():\n"
              "    import tests.proxy.test_x\n")
    assert {name for _, name in imported(source, "tests.proxy.probe")} >= {
        "tests.proxy.test_passthrough", "tests.helpers.proxy", "tests.proxy.test_channel", "tests.proxy.test_x"}
