"""What tests of deploy/helm/ share: Helm built from the Go module proxy (once per version,
cached in ~/.cache/tierproxy/), the chart, its test values files, and rendering.

Helm is pinned: `go install helm.sh/helm/v4/cmd/helm@HELM_VERSION` into a directory named
after the version, under a lock so that concurrent test runs build it once.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "tierproxy"
GO_MODULE = Path(__file__).resolve().parent / "helm"  # the strict decoding test (objects_test.go)
VALUES = sorted((GO_MODULE / "values").glob("*.yaml"))
HELM_MODULE = "helm.sh/helm/v4/cmd/helm"
HELM_VERSION = "v4.3.1"
CACHE = Path(os.environ.get("TIERPROXY_CACHE", Path.home() / ".cache" / "tierproxy"))
RELEASE, NAMESPACE = "tierproxy", "tiering"


def go() -> str:
    found = shutil.which("go")
    if found is None:
        raise RuntimeError("the Helm chart's tests need Go (https://go.dev/dl/) to build Helm and decode its objects")
    return found


def helm_binary() -> Path:
    """The pinned Helm, built on first use (minutes on two cores; the module cache is kept)."""
    directory = CACHE / f"helm-{HELM_VERSION}"
    binary = directory / "helm"
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            env = {**os.environ, "GOBIN": str(directory)}
            subprocess.run([go(), "install", f"{HELM_MODULE}@{HELM_VERSION}"], env=env, check=True,
                           capture_output=True, text=True, timeout=1800)
    return binary


def helm(*args: str | Path, check: bool = False) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(helm_binary()), *map(str, args)], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(map(str, args))} failed:\n{result.stdout}{result.stderr}")
    return result


def template(*values: Path, chart: Path = CHART, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart with these values files on top of its defaults."""
    args: list[str | Path] = ["template", RELEASE, chart, "--namespace", NAMESPACE]
    for path in values:
        args += ["--values", path]
    return helm(*args, *extra)


def objects(manifest: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def find(docs: list[dict], kind: str, suffix: str = "") -> dict:
    """The one object of `kind` whose name ends with `suffix`."""
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{len(found)} {kind} objects named *{suffix}: {[d['metadata']['name'] for d in found]}"
    return found[0]


def go_test(rendered: Path) -> subprocess.CompletedProcess[str]:
    """objects_test.go over the rendered manifests in `rendered` (*.yaml)."""
    env = {**os.environ, "TIERPROXY_RENDERED": str(rendered)}
    return subprocess.run([go(), "test", "-count=1", "./..."], cwd=GO_MODULE, env=env, capture_output=True,
                          text=True, timeout=1200)


# --- the values reference of docs/operations.md, generated from values.schema.json ----------

SCHEMA = CHART / "values.schema.json"
OPERATIONS = ROOT / "docs" / "operations.md"
REFERENCE_BEGIN = "<!-- values reference: generated from deploy/helm/tierproxy/values.schema.json by " \
                  "`python -m tests.deploy.helm_chart`; do not edit by hand -->"
REFERENCE_END = "<!-- end of the values reference -->"


def _resolve(schema: dict, node: dict) -> dict:
    ref = node.get("$ref")
    return {**schema["definitions"][ref.rsplit("/", 1)[1]], **node} if ref else node


def _type(node: dict) -> str:
    if "enum" in node:
        return "one of " + ", ".join(f"`{v}`" for v in node["enum"])
    kinds = node.get("type", "object")
    return " or ".join(kinds) if isinstance(kinds, list) else kinds


def _default(values: dict, path: list[str]) -> str:
    value: object = values
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return ""
        value = value[part]
    text = json.dumps(value, separators=(", ", ": "))
    return f"`{text}`" if len(text) <= 60 else "see values.yaml"


def _described(schema: dict, node: dict) -> bool:
    """Whether the node or anything below it has a description."""
    node = _resolve(schema, node)
    return "description" in node or any(_described(schema, c) for c in node.get("properties", {}).values())


def _rows(schema: dict, node: dict, path: list[str], values: dict) -> list[str]:
    """One row per described value; an object whose fields are described gets theirs instead."""
    node = _resolve(schema, node)
    children = node.get("properties", {})
    if any(_described(schema, child) for child in children.values()):
        return [row for name, child in children.items() for row in _rows(schema, child, [*path, name], values)]
    description = node.get("description", "").replace("|", "\\|")
    return [f"| `{'.'.join(path)}` | {_type(node)} | {_default(values, path)} | {description} |"]


def values_reference() -> str:
    """The table of every value: its type, its default (values.yaml) and what it does."""
    schema = yaml.safe_load(SCHEMA.read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    lines = ["| Value | Type | Default | Description |", "|---|---|---|---|"]
    lines += _rows(schema, schema, [], values)
    return "\n".join(lines)


def reference_in_operations() -> str:
    """What docs/operations.md holds between the markers."""
    text = OPERATIONS.read_text()
    start, end = text.index(REFERENCE_BEGIN) + len(REFERENCE_BEGIN), text.index(REFERENCE_END)
    return text[start:end].strip("\n")


def write_reference() -> None:
    text = OPERATIONS.read_text()
    start, end = text.index(REFERENCE_BEGIN) + len(REFERENCE_BEGIN), text.index(REFERENCE_END)
    OPERATIONS.write_text(f"{text[:start]}\n{values_reference()}\n{text[end:]}")


if __name__ == "__main__":
    write_reference()
