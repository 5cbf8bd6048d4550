"""The Helm chart (deploy/helm/tierproxy), checked without a cluster: `helm lint --strict` and
`helm template` for each values file of tests/deploy/helm/values/, every rendered object
decoded strictly into its Kubernetes (or prometheus-operator) Go type, the rendered
properties through `tierproxy config check` (with the init container's own step adding the
Secrets' values), the monitoring objects equal to deploy/, and a failing case for each check.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.tls import write_tls_files
from tierproxy.config import KEYS, load
from tierproxy.config.broker_ports import NodePorts

from .helm_chart import (CHART, ROOT, SCHEMA, VALUES, find, go_test, helm, objects,
                         reference_in_operations, template, values_reference)
from .rules import DASHBOARD, RULE_FILES

pytestmark = pytest.mark.timeout(1800)  # the first run on a machine builds Helm
VALUES_BY_NAME = {path.stem: path for path in VALUES}


@pytest.fixture(scope="module")
def rendered_dir(tmp_path_factory) -> Path:
    """`helm template` of each values file, as <name>.yaml in one directory (the Go test's input)."""
    directory = tmp_path_factory.mktemp("rendered")
    for name, path in VALUES_BY_NAME.items():
        result = template(path)
        assert result.returncode == 0, f"helm template with {path.name}:\n{result.stderr}"
        (directory / f"{name}.yaml").write_text(result.stdout)
    return directory


@pytest.fixture(scope="module")
def rendered(rendered_dir) -> dict[str, list[dict]]:
    """The rendered objects of each values file, by the file's name."""
    return {name: objects((rendered_dir / f"{name}.yaml").read_text()) for name in VALUES_BY_NAME}


def test_the_values_files_cover_what_the_chart_offers():
    assert set(VALUES_BY_NAME) == {"defaults", "secure", "node-id-map", "node-id-range", "replica-only", "cronjob"}


@pytest.mark.parametrize("name", sorted(VALUES_BY_NAME))
def test_lint_strict_passes(name):
    result = helm("lint", "--strict", CHART, "--values", VALUES_BY_NAME[name])
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_objects_decode_strictly_into_their_types(rendered_dir):
    result = go_test(rendered_dir)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_misspelled_field_fails_the_strict_decoding(rendered_dir, tmp_path):
    manifest = (rendered_dir / "defaults.yaml").read_text()
    assert "readinessProbe:" in manifest
    (tmp_path / "typo.yaml").write_text(manifest.replace("readinessProbe:", "readinesProbe:", 1))
    result = go_test(tmp_path)
    assert result.returncode != 0
    assert 'unknown field "spec.template.spec.containers[0].readinesProbe"' in result.stdout


# --- the properties ------------------------------------------------------------------------


def _properties(docs: list[dict]) -> str:
    return find(docs, "ConfigMap", "tierproxy")["data"]["tierproxy.properties"]


def _pod_specs(docs: list[dict]) -> dict[str, dict]:
    """The pod spec of each Deployment and CronJob, by the object's name."""
    specs = {}
    for doc in docs:
        if doc["kind"] == "Deployment":
            specs[doc["metadata"]["name"]] = doc["spec"]["template"]["spec"]
        elif doc["kind"] == "CronJob":
            specs[doc["metadata"]["name"]] = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert specs, "no pod rendered"
    return specs


def _pod_spec(docs: list[dict], suffix: str) -> dict:
    (spec,) = [spec for name, spec in _pod_specs(docs).items() if name.endswith(suffix)]
    return spec


def _secret_files(tmp_path: Path) -> dict[str, Path]:
    """What secure.yaml's Secrets hold, as files: a CA, a client certificate and key, the
    proxy's certificate and key, two encryption keys."""
    tls = write_tls_files(tmp_path / "tls")
    kafka = tmp_path / "kafka-tls"
    kafka.mkdir()
    shutil.copy(tls.ca, kafka / "ca.crt")
    shutil.copy(tls.client_cert, kafka / "user.crt")
    shutil.copy(tls.client_key, kafka / "user.key")
    proxy = tmp_path / "proxy-tls"
    proxy.mkdir()
    shutil.copy(tls.broker_cert, proxy / "tls.crt")
    shutil.copy(tls.broker_key, proxy / "tls.key")
    keys = tmp_path / "keys"
    keys.mkdir()
    for key_id in ("k1", "k2"):
        (keys / f"{key_id}.key").write_text(base64.b64encode(bytes(range(32))).decode() + "\n")
    return {"/etc/tierproxy/kafka-tls": kafka, "/etc/tierproxy/proxy-tls": proxy, "/etc/tierproxy/keys": keys}


def _run_init_container(docs: list[dict], tmp_path: Path, secret_values: dict[str, str]) -> Path:
    """The pod's init container, run here as the pod runs it (python -c SCRIPT SRC SECRETS OUT),
    with the ConfigMap's file and a directory laid out like the projected Secret volume."""
    spec = next(iter(_pod_specs(docs).values()))  # every pod has the same init container
    (init,) = spec["initContainers"]
    python, flag, script, src, secrets, out = init["command"]
    assert (python, flag) == ("python", "-c")
    mounted = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    assert mounted[str(Path(src).parent)] == "config" and mounted[secrets] == "secret-properties"
    assert mounted[str(Path(out).parent)] == "run"
    source = tmp_path / "tierproxy.properties"
    source.write_text(_properties(docs))
    secret_dir = tmp_path / "secret-properties"
    secret_dir.mkdir()
    (secret_dir / "..data").mkdir()  # what kubelet's atomic writer leaves beside the keys
    for name, value in secret_values.items():
        (secret_dir / name).write_text(value + "\n")
    result_file = tmp_path / "run" / "tierproxy.properties"
    result_file.parent.mkdir()
    subprocess.run([sys.executable, "-c", script, source, secret_dir, result_file], check=True, timeout=60)
    return result_file


def _config_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tierproxy", "config", "check", "--config", path],
                          capture_output=True, text=True, timeout=120)


# A Secret value with what the properties syntax escapes: quotes, a backslash, '=', ':' and '#'.
JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="tierproxy" '
        'password="p=a:s\\s#word";')


def _pod_config(name: str, docs: list[dict], tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The file a pod of values file `name` reads: the init container's output, with made-up
    values for its secretProperties, and the Secrets it mounts as files laid out in tmp_path
    (their paths in the file moved there). Returns the file and the secret values."""
    values = yaml.safe_load(VALUES_BY_NAME[name].read_text())
    secret_values = {item["property"]: JAAS if item["property"] == "sasl.jaas.config" else "s3cr=t"
                     for item in values.get("secretProperties", [])}
    path = _run_init_container(docs, tmp_path, secret_values)
    text = path.read_text()
    for mount, local in _secret_files(tmp_path).items():
        text = text.replace(mount, str(local))
    path.write_text(text)
    return path, secret_values


@pytest.mark.parametrize("name", sorted(VALUES_BY_NAME))
def test_rendered_properties_pass_config_check(name, rendered, tmp_path):
    path, secret_values = _pod_config(name, rendered[name], tmp_path)
    result = _config_check(path)
    assert result.returncode == 0, result.stderr
    config = load(path)
    for prop, value in secret_values.items():
        assert config[prop] == value  # the Secret's value, trailing newline dropped, escapes undone
    given = yaml.safe_load(VALUES_BY_NAME[name].read_text()).get("config", {})
    for prop in given:
        assert re.search(rf"^{re.escape(prop)}\s+\S.*\s(file)$", result.stdout, re.M), f"{prop} not from the file"


def test_secrets_are_never_in_the_configmap(rendered):
    for name, docs in rendered.items():
        properties = _properties(docs)
        for key in (k for k in KEYS.values() if k.secret):
            assert f"\n{key.name}=" not in properties, f"{name}: {key.name} in the ConfigMap"


def test_an_unknown_key_fails_config_check(tmp_path):
    values = tmp_path / "typo.yaml"
    values.write_text(yaml.safe_dump({"config": {"remote.fetch.max.wiat.ms": 500}}))
    result = template(VALUES_BY_NAME["defaults"], values)
    assert result.returncode == 0, result.stderr
    path = _run_init_container(objects(result.stdout), tmp_path, {})
    check = _config_check(path)
    assert check.returncode == 2
    assert "remote.fetch.max.wiat.ms: unknown configuration key (did you mean remote.fetch.max.wait.ms?)" in check.stderr


@pytest.mark.parametrize("key", ["sasl.jaas.config", "sasl.password", "remote.log.storage.s3.secret.access.key"])
def test_a_secret_inlined_in_values_is_refused(key, tmp_path):
    values = tmp_path / "inline.yaml"
    values.write_text(yaml.safe_dump({"config": {key: "hunter2"}}))
    result = template(VALUES_BY_NAME["defaults"], values)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert key in result.stderr and "hunter2" not in result.stdout
    lint = helm("lint", "--strict", CHART, "--values", VALUES_BY_NAME["defaults"], "--values", values)
    assert lint.returncode != 0


def test_the_schema_refuses_every_secret_key_the_configuration_declares():
    schema = json.loads(SCHEMA.read_text())
    refused = set(schema["properties"]["config"]["propertyNames"]["not"]["enum"])
    assert refused == {key.name for key in KEYS.values() if key.secret}


def test_a_misspelled_value_is_refused_by_the_schema(tmp_path):
    values = tmp_path / "typo.yaml"
    values.write_text(yaml.safe_dump({"proxy": {"replicas": 3}}))
    result = template(VALUES_BY_NAME["defaults"], values)
    assert result.returncode != 0
    assert "replicas" in result.stderr and "additional properties" in result.stderr.lower()


@pytest.mark.parametrize(("config", "message"), [
    ({"remote.log.storage.backend": "local"}, "remote.log.storage.backend must be s3"),
    ({"remote.log.metadata.backend": "file"}, "remote.log.metadata.backend must be topic or remote"),
    ({"metrics.port": 0}, "metrics.port must not be 0"),
])
def test_what_cannot_work_in_a_cluster_is_refused(config, message, tmp_path):
    values = tmp_path / "bad.yaml"
    values.write_text(yaml.safe_dump({"config": config}))
    result = template(VALUES_BY_NAME["defaults"], values)
    assert result.returncode != 0 and message in result.stderr


def test_without_bootstrap_servers_rendering_names_the_key():
    result = template()
    assert result.returncode != 0 and "bootstrap.servers is required" in result.stderr


def test_chart_defaults_are_the_configuration_defaults(rendered, tmp_path):
    """The ports and listener the chart writes when not given are tierproxy's own defaults
    (the listener host aside: a pod listens on every address)."""
    config = load(_pod_config("defaults", rendered["defaults"], tmp_path)[0])
    for key in ("proxy.bootstrap.port", "proxy.broker.port.base", "metrics.port", "pipeline.metrics.port"):
        assert config[key] == KEYS[key].default
    assert config["proxy.listener.host"] == "0.0.0.0"
    assert config["proxy.advertised.host"] == "tierproxy.tiering.svc"
    assert config["proxy.workers"] == 2 and config["spark.master"] == "local[2]"


@pytest.mark.parametrize(("name", "workers", "spark"), [
    ("secure", 3, "local[2]"), ("node-id-map", 1, "local[2]"), ("cronjob", 2, "local[2]")])
def test_workers_and_spark_cores_follow_the_cpu_requests(name, workers, spark, rendered, tmp_path):
    config = load(_pod_config(name, rendered[name], tmp_path)[0])
    assert config["proxy.workers"] == workers and config["spark.master"] == spark


@pytest.mark.parametrize("name", ["defaults", "node-id-map", "node-id-range", "secure"])
def test_service_and_container_ports_are_the_proxys_own(name, rendered, tmp_path):
    """Each node port of the Service and of the container is where the proxy, reading the
    rendered file, listens for that node (config/broker_ports.py)."""
    docs = rendered[name]
    config = load(_pod_config(name, docs, tmp_path)[0])
    ports = NodePorts.of(config)
    service = find(docs, "Service", "tierproxy")["spec"]["ports"]
    container = _pod_spec(docs, "-proxy")["containers"][0]["ports"]
    metrics = find(docs, "Service", "-metrics")["spec"]["ports"]
    assert [(p["name"], p["port"]) for p in metrics] == [("metrics", config["metrics.port"])]
    by_name = {p["name"]: p["port"] for p in service}
    assert {p["name"]: p["containerPort"] for p in container} == {**by_name, "metrics": config["metrics.port"]}
    assert by_name.pop("bootstrap") == config["proxy.bootstrap.port"]
    assert by_name, "no broker port"
    for port_name, port in by_name.items():
        assert ports.port(int(port_name.removeprefix("node-"))) == port
    expected = {"node-id-map": {1001: 9201, 1002: 9202, 1005: 9205},
                "node-id-range": {100 + i: 9300 + i for i in range(5)}}.get(name)
    if expected:
        assert {int(n.removeprefix("node-")): p for n, p in by_name.items()} == expected


def test_pods_run_as_the_images_user_on_a_read_only_root(rendered):
    uid = int(re.search(r"--uid (\d+)", (ROOT / "Dockerfile").read_text()).group(1))
    for docs in rendered.values():
        for spec in _pod_specs(docs).values():
            assert spec["securityContext"]["runAsUser"] == uid and spec["securityContext"]["runAsNonRoot"]
            for container in spec["containers"] + spec["initContainers"]:
                assert container["securityContext"]["readOnlyRootFilesystem"] is True
                assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_proxy_is_ready_by_ready_and_alive_by_metrics(rendered):
    """Both probes ask the metrics endpoint: /ready (listeners open, a broker answering, see
    proxy/readiness.py) and /metrics."""
    proxies = {name: spec["containers"][0] for name, docs in rendered.items()
               for pod, spec in _pod_specs(docs).items() if pod.endswith("-proxy")}
    assert "defaults" in proxies and "cronjob" not in proxies  # cronjob.yaml turns the proxy off
    for name, container in proxies.items():
        assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}, name
        assert container["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}, name


def test_one_pipeline_at_a_time(rendered):
    deployment = find(rendered["defaults"], "Deployment", "-pipeline")["spec"]
    assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}
    assert deployment["template"]["spec"]["containers"][0]["command"][-1] == "--every"
    cronjob = find(rendered["cronjob"], "CronJob", "-pipeline")["spec"]
    assert cronjob["concurrencyPolicy"] == "Forbid"
    assert not [d for d in rendered["cronjob"] if d["kind"] == "Deployment"]
    assert not [d for d in rendered["replica-only"] if d["metadata"]["name"].endswith("-pipeline")]


# --- monitoring: the objects are deploy/'s files -------------------------------------------


def test_the_charts_copies_are_deploys_files():
    copies = {CHART / "files" / "rules" / p.name: p for p in RULE_FILES}
    copies[CHART / "files" / "grafana" / DASHBOARD.name] = DASHBOARD
    assert sorted((CHART / "files").rglob("*.*")) == sorted(copies), "files/ holds exactly deploy's files"
    for copy, original in copies.items():
        assert copy.read_bytes() == original.read_bytes(), (
            f"{copy.relative_to(ROOT)} differs from {original.relative_to(ROOT)}: copy it again")


def test_the_prometheus_rule_is_deploy_rules(rendered):
    rule = find(rendered["secure"], "PrometheusRule", "tierproxy")
    expected = [group for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]]
    assert rule["spec"]["groups"] == expected


def test_a_rule_changed_in_the_chart_alone_is_told_apart(tmp_path):
    """The comparison above fails when the chart's copy says something deploy/rules does not."""
    chart = tmp_path / "tierproxy"
    shutil.copytree(CHART, chart)
    copy = chart / "files" / "rules" / RULE_FILES[0].name
    copy.write_text(copy.read_text().replace("for: 2m", "for: 20m", 1))
    result = template(VALUES_BY_NAME["secure"], chart=chart)
    assert result.returncode == 0, result.stderr
    rule = find(objects(result.stdout), "PrometheusRule", "tierproxy")
    expected = [group for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]]
    assert rule["spec"]["groups"] != expected


def test_the_dashboard_configmap_is_deploys_dashboard(rendered):
    configmap = find(rendered["secure"], "ConfigMap", "-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["tierproxy.json"]) == json.loads(DASHBOARD.read_text())


def test_monitors_name_the_jobs_the_rules_alert_on(rendered):
    """deploy/rules alert on up{job="tierproxy-proxy"} and up{job="tierproxy-pipeline"}: the
    monitors take `job` from a label whose values are those names."""
    docs = rendered["secure"]
    rules_text = "".join(p.read_text() for p in RULE_FILES)
    monitor = find(docs, "ServiceMonitor", "-proxy")["spec"]
    selected = [d for d in docs if d["kind"] == "Service"
                and monitor["selector"]["matchLabels"].items() <= d["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in selected] == ["tierproxy-metrics"]  # not the clients' Service
    assert selected[0]["metadata"]["labels"][monitor["jobLabel"]] == "tierproxy-proxy"
    pod_monitor = find(docs, "PodMonitor", "-pipeline")["spec"]
    pod_labels = find(docs, "Deployment", "-pipeline")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[pod_monitor["jobLabel"]] == "tierproxy-pipeline"
    for job in ("tierproxy-proxy", "tierproxy-pipeline"):
        assert f'job="{job}"' in rules_text


# --- docs ----------------------------------------------------------------------------------


def test_operations_values_reference_is_current():
    assert reference_in_operations() == values_reference(), (
        "docs/operations.md's values reference is out of date; regenerate it with: python -m tests.deploy.helm_chart")


def test_values_reference_lists_every_value():
    reference = values_reference()
    for value in ("config", "secretProperties", "proxy.replicaCount", "pipeline.mode", "image.tag",
                  "monitoring.prometheusRule.enabled", "s3Credentials.secretName"):
        assert f"| `{value}` |" in reference
    assert "| `proxy.replicaCount` | integer | `2` |" in reference
