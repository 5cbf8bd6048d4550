"""Static analysers follow `tierproxy.*` to the repository's own files: jedi (what editors
use for jump-to-definition) resolves a name of every layer, both in an editor opened on the
checkout and from anywhere else through the venv. Neither runs the editable install's
import hook; they find the links in tierproxy/ and the venv's plain path entry."""

from __future__ import annotations

import sys
from pathlib import Path

import jedi
import pytest

ROOT = Path(__file__).resolve().parents[2]
# A name from each package, and the file that defines it.
NAMES = {
    "tierproxy.cli": ("main", "tierproxy/cli.py"),
    "tierproxy.protocol.framing": ("FrameDecoder", "protocol/framing.py"),
    "tierproxy.config": ("Config", "config/__init__.py"),
    "tierproxy.client.cluster": ("Cluster", "client/cluster.py"),
    "tierproxy.storage.errors": ("CorruptRemoteSegment", "storage/errors.py"),
    "tierproxy.storage.metadata.file_store": ("FileRemoteLogMetadataManager", "storage/metadata/file_store.py"),
    "tierproxy.cache.chunk_cache": ("ChunkCache", "cache/chunk_cache.py"),
    "tierproxy.remote_log.reader": ("RemoteReadResult", "remote_log/reader.py"),
    "tierproxy.proxy.filters.fetch": ("FetchFilter", "proxy/filters/fetch.py"),
    "tierproxy.pipeline.local_retention": ("local_trim", "pipeline/local_retention.py"),
}


def _definitions(project: Path) -> dict[str, set[Path]]:
    source = "".join(f"from {module} import {name}\n" for module, (name, _) in NAMES.items())
    script = jedi.Script(source, path=project / "probe.py", project=jedi.Project(project),
                         environment=jedi.create_environment(sys.prefix, safe=False))
    found = {}
    for line, (module, (name, _)) in enumerate(NAMES.items(), 1):
        definitions = script.goto(line, len(f"from {module} import {name}") - 1, follow_imports=True)
        found[module] = {Path(d.module_path).resolve() for d in definitions if d.module_path is not None}
    return found


@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_every_layer_resolves_to_its_file(where, tmp_path):
    found = _definitions(ROOT if where == "checkout" else tmp_path)
    expected = {module: {(ROOT / path).resolve()} for module, (_, path) in NAMES.items()}
    assert found == expected


def test_every_layer_has_its_link():
    layers = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tierproxy", "tests", "testbed"}
    links = {p.name: p.resolve() for p in (ROOT / "tierproxy").iterdir() if p.is_symlink()}
    assert links == {layer: ROOT / layer for layer in layers}
