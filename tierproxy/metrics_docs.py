"""docs/metrics.md, generated from the metric families tierproxy declares, wherever they
are declared: every module of every package of tierproxy is read (not imported), and
each call of prometheus-client's Counter, Gauge, Histogram, Summary, Info or Enum whose
name is a string literal is a family. So a family added, renamed or moved anywhere shows
up here, and a test compares the committed file with what this generates:

    tierproxy config metrics > docs/metrics.md
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import tierproxy

__all__ = ("Family", "REGENERATE", "declared_families", "generate_metrics_docs", "sample_names")

REGENERATE = "tierproxy config metrics > docs/metrics.md"
_TYPES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary", "Info": "info",
          "Enum": "stateset"}
# Kafka's own name of what a family measures, as its help text cites it.
_KAFKA_NAME = re.compile(r"Kafka's ([A-Z][A-Za-z]+|[a-z]+(?:-[a-z]+)+)")
# Kafka's names of what the remote read side measures, whose help texts predate citing them
# (Kafka's RemoteStorageMetrics; KIP-405 proposed RemoteRead... for RemoteFetch...).
_KAFKA_NAMES = {
    "tierproxy_remote_read_requests": "RemoteFetchRequestsPerSec",
    "tierproxy_remote_fetch_bytes": "RemoteFetchBytesPerSec",
    "tierproxy_remote_read_errors": "RemoteFetchErrorsPerSec",
    "tierproxy_remote_log_reader_task_queue_size": "RemoteLogReaderTaskQueueSize",
}
# Which endpoint serves a package's families.
_SERVED_BY = {"pipeline": "`tier --every`", "config": "`serve`, `tier --every`"}


@dataclass(frozen=True, order=True)
class Family:
    name: str
    type: str
    help: str
    labels: tuple[str, ...]
    package: str  # tierproxy's package that declares it

    @property
    def kafka_name(self) -> str:
        match = _KAFKA_NAME.search(self.help)
        return match.group(1) if match else _KAFKA_NAMES.get(self.name, "")

    @property
    def served_by(self) -> str:
        return _SERVED_BY.get(self.package, "`serve`")


def sample_names(family: Family) -> list[str]:
    """The names of the family's samples in the text format (no `_created`: tierproxy turns them off)."""
    base = family.name.removesuffix("_total") if family.type == "counter" else family.name
    return {
        "counter": [f"{base}_total"],
        "histogram": [f"{base}_bucket", f"{base}_sum", f"{base}_count"],
        "summary": [base, f"{base}_sum", f"{base}_count"],
        "info": [f"{base}_info"],
    }.get(family.type, [base])


def _packages() -> Iterator[tuple[str, Path]]:
    """(package, folder) of every package of tierproxy: the folders beside or inside the
    command's own (a source tree, an editable install, or a wheel) that import as
    `tierproxy.<name>`, and the command's package itself."""
    home = Path(tierproxy.__file__).resolve().parent
    yield "tierproxy", home
    names = {p.parent.name for root in (home, home.parent) for p in root.glob("*/__init__.py")}
    for name in sorted(names):
        try:
            spec = importlib.util.find_spec(f"tierproxy.{name}")
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                yield name, Path(location)


def _literal(node: ast.AST | None) -> object:
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        return None


def _families_in(path: Path, package: str) -> Iterator[Family]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if callee not in _TYPES or not node.args:
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        name = _literal(node.args[0])
        if not isinstance(name, str) or not name.startswith("tierproxy_"):
            continue
        documentation = _literal(node.args[1] if len(node.args) > 1 else keywords.get("documentation"))
        labels = _literal(node.args[2] if len(node.args) > 2 else keywords.get("labelnames"))
        yield Family(name, _TYPES[callee], str(documentation or ""),
                     tuple(labels) if isinstance(labels, (tuple, list)) else (), package)


def declared_families() -> list[Family]:
    """Every family, by name. A name declared twice must be the same family."""
    families: dict[str, Family] = {}
    seen: set[Path] = set()
    home = Path(tierproxy.__file__).resolve().parent
    for package, folder in _packages():
        # The command's own folder holds the other packages in a wheel: its files only.
        paths = folder.glob("*.py") if folder.resolve() == home else folder.rglob("*.py")
        for path in sorted(paths):
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            for family in _families_in(path, package):
                first = families.setdefault(family.name, family)
                if first != family:
                    raise ValueError(f"metric family {family.name} is declared twice, differently")
    return sorted(families.values())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def generate_metrics_docs() -> str:
    families = declared_families()
    lines = [
        "# Metrics reference",
        "",
        f"<!-- Generated from the metric declarations by `{REGENERATE}`. Do not edit by hand. -->",
        "",
        "`tierproxy serve` (the proxy) and `tierproxy tier --every` (the pipeline) serve Prometheus'",
        "text format on `metrics.port` and `pipeline.metrics.port` (see [configuration.md](configuration.md)).",
        "Counters are exposed with the `_total` suffix and without `_created` series;",
        "histograms as `_bucket`, `_sum` and `_count`. Where Kafka's tiered storage measures",
        "the same thing, its name is given (KIP-405, KIP-963 and KIP-956 metrics); rates are",
        "Prometheus' `rate()` of the counters. Alert and recording rules over these are in",
        "`deploy/rules/`, a Grafana dashboard in `deploy/grafana/`.",
        "",
        "| Metric | Type | Labels | Served by | Kafka | Description |",
        "|---|---|---|---|---|---|",
    ]
    for family in families:
        samples = ", ".join(f"`{name}`" for name in sample_names(family))
        labels = ", ".join(f"`{label}`" for label in family.labels)
        lines.append(f"| {samples} | {family.type} | {labels} | {family.served_by} | {family.kafka_name} | "
                     f"{_cell(family.help)} |")
    lines.append("")
    return "\n".join(lines)
