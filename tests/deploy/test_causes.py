"""The `cause` and `reason` values the alerts and their unit tests use are the ones the
code counts (remote_log/failures.py), and every cause the code counts has an alert."""

from __future__ import annotations

import re

import yaml

from tierproxy.remote_log.failures import Cause
from tests.deploy.rules import UNIT_TESTS, rules

CAUSES = {cause.value for cause in Cause}
# The counters of failed remote reads; other metrics' `reason` (the pipeline's checks of
# remote segments, say) has a list of its own.
_READ_ERRORS = re.compile(r"\btierproxy[_:](?:tiered_storage_not_available|remote_read_errors)"
                          r"(?:_total|:\w+)?\{([^}]*)\}")
_MATCHER = re.compile(r'\b(?:cause|reason)\s*=~?\s*"([^"]*)"')


def _values(text: str) -> set[str]:
    """Label values of every cause/reason matcher of the read error counters in a PromQL
    expression, a recorded series or a series name."""
    return {value for selector in _READ_ERRORS.findall(text) for alternatives in _MATCHER.findall(selector)
            for value in alternatives.split("|")}


def _read_error_alerts() -> set[str]:
    return {rule["alert"] for rule in rules() if "alert" in rule and _READ_ERRORS.search(rule["expr"])}


def _unit_test_values() -> set[str]:
    found: set[str] = set()
    for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for series in test.get("input_series", []):
            found |= _values(series["series"])
        for check in test.get("promql_expr_test", []):
            found |= _values(check["expr"])
            for sample in check.get("exp_samples", []):
                found |= _values(sample["labels"])
        for check in test.get("alert_rule_test", []):
            if check["alertname"] not in _read_error_alerts():
                continue
            for alert in check.get("exp_alerts") or []:
                found |= {v for k, v in alert["exp_labels"].items() if k in ("cause", "reason")}
    return found


def test_the_alerts_and_their_tests_use_only_the_codes_causes():
    used = _unit_test_values()
    assert {"store_unavailable", "queue_full"} <= used
    assert used <= CAUSES, used - CAUSES
    in_rules = set().union(*(_values(rule["expr"]) for rule in rules()))
    assert in_rules <= CAUSES, in_rules - CAUSES


def test_every_cause_has_an_alert():
    alerted = set().union(*(_values(rule["expr"]) for rule in rules() if "alert" in rule))
    assert alerted == CAUSES, CAUSES - alerted
