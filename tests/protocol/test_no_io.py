"""protocol/ does no I/O: it imports no networking, event loop, cloud or Spark code."""

import ast
import json
import pathlib
import subprocess
import sys

from tierproxy import protocol

# Never loaded at all by importing protocol.
HEAVY = ("aiobotocore", "aiokafka", "boto3", "botocore", "pyspark", "uvloop")
# Never imported by protocol's own modules. (kio.serial.writers imports asyncio for a
# type alias, so asyncio may be loaded, but only from there.)
IO = ("asyncio", "selectors", "socket", "ssl", *HEAVY)

_CHILD = """
import builtins, importlib, json, pkgutil, sys
importers = {}
real_import = builtins.__import__
def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
    top = name.split(".")[0]
    if level == 0 and top in %(io)r and top not in sys.modules:
        importers.setdefault(top, set()).add((globals or {}).get("__name__"))
    return real_import(name, globals, locals, fromlist, level)
builtins.__import__ = recording_import
sys.modules["hypothesis"] = None  # a test dependency kio picks up when present
from tierproxy import protocol
names = [m.name for m in pkgutil.walk_packages(protocol.__path__, "tierproxy.protocol.")]
for name in names:
    importlib.import_module(name)
print(json.dumps({
    "modules": names,
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in %(heavy)r),
    "importers": {k: sorted(map(str, v)) for k, v in importers.items()},
}))
"""


def test_importing_protocol_loads_no_io_packages():
    code = _CHILD % {"io": IO, "heavy": HEAVY}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert {"tierproxy.protocol.framing", "tierproxy.protocol.headers", "tierproxy.protocol.codecs", "tierproxy.protocol.apis"} <= set(report["modules"])
    assert report["loaded"] == []
    for package, importers in report["importers"].items():
        assert all(not name.startswith("tierproxy.protocol") for name in importers), (package, importers)
    assert set(report["importers"]) <= {"asyncio", "selectors", "socket", "ssl"}
    assert report["importers"].get("asyncio", ["kio.serial.writers"]) == ["kio.serial.writers"]


def test_protocol_sources_import_no_io_modules():
    root = pathlib.Path(protocol.__file__).parent
    sources = sorted(root.rglob("*.py"))
    assert len(sources) >= 5
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in IO, f"{source.name} imports {name}"
