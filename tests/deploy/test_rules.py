"""deploy/rules/: promtool accepts the rule files and deploy/prometheus.yml, the unit
tests of tierproxy.test.yml pass (and fail when a rule changes), and every rule reads
only metrics tierproxy serves."""

from __future__ import annotations

import shutil
import subprocess

from tests.deploy.rules import DEPLOY, RULE_FILES, RULES, UNIT_TESTS, rules, unknown_metrics

ALERTS = {"TierproxyProxyDown", "TierproxyPipelineDown", "TierproxyRemoteStoreUnavailable",
          "TierproxyCorruptRemoteReads", "TierproxyRemoteObjectMissing", "TierproxyEncryptionKeyMissing",
          "TierproxyUnencryptedRemoteSegments", "TierproxyRemoteReadsFailUnexpectedly",
          "TierproxyRemoteMetadataNotReady", "TierproxyRemoteLogMetadataUnreadable", "TierproxyReaderQueueFull", "TierproxyRemoteCopyErrors",
          "TierproxyCopyLagGrowing", "TierproxyTierPassesFailing", "TierproxyRemoteSegmentVerifyFailed"}


def _promtool(*args: str, cwd=RULES) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: make system (Debian's prometheus package)"
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_rules_and_the_configuration():
    done = _promtool("check", "rules", *map(str, RULE_FILES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(RULE_FILES) == 2
    done = _promtool("check", "config", str(DEPLOY / "prometheus.yml"), cwd=DEPLOY)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in done.stdout  # rule_files names deploy/rules/


def test_the_alerts_are_there_and_read_only_metrics_that_exist():
    assert {rule["alert"] for rule in rules() if "alert" in rule} == ALERTS
    for rule in rules():
        assert not unknown_metrics(rule["expr"]), (rule.get("alert") or rule["record"], unknown_metrics(rule["expr"]))


def test_the_unit_tests_pass():
    done = _promtool("test", "rules", UNIT_TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_unit_tests_fail_when_an_alert_waits_longer(tmp_path):
    for path in [*RULE_FILES, UNIT_TESTS]:
        shutil.copy(path, tmp_path / path.name)
    alerts = tmp_path / "alerts.rules.yml"
    text = alerts.read_text()
    for alert, waits in (("TierproxyProxyDown", "for: 2m"), ("TierproxyRemoteStoreUnavailable", "for: 2m")):
        rule = text.index(f"alert: {alert}\n")
        waited = text[:rule] + text[rule:].replace(waits, "for: 5m", 1)
        alerts.write_text(waited)
        done = _promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
        assert done.returncode != 0
        assert alert in done.stdout + done.stderr
