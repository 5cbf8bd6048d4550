"""What tests of deploy/ share: the rule files, the names they record, the dashboard's
queries, and the metric names an expression reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tierproxy.metrics_docs import declared_families, sample_names

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "rules"
RULE_FILES = sorted(RULES.glob("*.rules.yml"))
UNIT_TESTS = RULES / "tierproxy.test.yml"
DASHBOARD = DEPLOY / "grafana" / "tierproxy.json"

_METRIC = re.compile(r"\b(tierproxy_[a-z0-9_]+|tierproxy:[a-z0-9_:]+)")


def rules() -> list[dict]:
    return [rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


def expressions() -> list[str]:
    """Every query of the Grafana dashboard."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def recorded() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def metric_samples() -> set[str]:
    """Every sample name tierproxy's endpoints serve (docs/metrics.md's list)."""
    return {name for family in declared_families() for name in sample_names(family)}


def unknown_metrics(expression: str) -> set[str]:
    """Names an expression reads that neither tierproxy serves nor a rule records."""
    return set(_METRIC.findall(expression)) - metric_samples() - recorded()
