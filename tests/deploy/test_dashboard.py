"""deploy/grafana/tierproxy.json is a Grafana dashboard whose queries read only metrics
tierproxy serves and names its rules record (they also run against a real Prometheus in
test_prometheus.py)."""

from __future__ import annotations

import json

from tests.deploy.rules import DASHBOARD, expressions, unknown_metrics


def test_the_dashboard_is_grafanas_with_one_prometheus_input():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "tierproxy" and dashboard["schemaVersion"] >= 36
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], panel["title"]


def test_every_query_names_only_metrics_that_exist():
    exprs = expressions()
    assert len(exprs) >= 20
    for expr in exprs:
        assert not unknown_metrics(expr), (expr, unknown_metrics(expr))
    # Both services and the rules are on it.
    text = " ".join(exprs)
    for name in ("tierproxy_remote_copy_lag_bytes", "tierproxy_connections_active", "tierproxy:remote_copy_bytes:rate5m",
                 "tierproxy_remote_copy_throttle_seconds_sum", "tierproxy_tier_passes_failed_total",
                 "tierproxy_remote_log_reader_busy_seconds_total", "tierproxy_remote_log_reader_task_queue_seconds_total"):
        assert name in text, name


def test_a_misspelt_metric_would_be_caught():
    assert unknown_metrics("rate(tierproxy_remote_copy_byte_total[5m])") == {"tierproxy_remote_copy_byte_total"}
    assert unknown_metrics("tierproxy:no_such_rule") == {"tierproxy:no_such_rule"}
