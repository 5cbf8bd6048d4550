"""docker-compose.yml, the Dockerfile and deploy/ agree with each other.

No Docker engine runs here, so this reads the files: the compose file (validated offline
against the Compose Specification's JSON schema, the copy vendored by check-jsonschema),
the one configuration file mounted into the proxy and the pipeline (loaded with config.load,
so every key in it must be valid), Prometheus' configuration and the Dockerfile's two
targets, and checks that hosts, ports, the bucket, the credentials and the mounted path
are the same everywhere, and that each image installs what its service runs.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import tomllib
from importlib.resources import files
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tierproxy.config import Config, load

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
PROPERTIES = ROOT / "deploy" / "tierproxy.properties"


# --------------------------------------------------------------------------- readers


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


@pytest.fixture(scope="module")
def config() -> Config:
    return load(PROPERTIES)


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _command(service: dict, key: str = "command") -> list[str]:
    command = service.get(key, [])
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def _flag(command: list[str], flag: str) -> str:
    """The value after `flag` (or of `flag=value`) in a command line."""
    for i, word in enumerate(command):
        if word == flag:
            return command[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {command}")


def _ports(service: dict) -> list[tuple[str, int, int]]:
    """(host ip, published port, container port) of each `ports` entry."""
    out = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            out.append((entry.get("host_ip", ""), int(entry["published"]), int(entry["target"])))
            continue
        parts = str(entry).split(":")
        host_ip = parts[0] if len(parts) == 3 else ""
        out.append((host_ip, int(parts[-2]), int(parts[-1])))
    return out


def _mounts(service: dict) -> list[tuple[str, str]]:
    """(source, target) of each volume; bind sources resolved against the compose file."""
    out = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            source, target = volume["source"], volume["target"]
        else:
            source, target = str(volume).split(":")[:2]
        if source.startswith((".", "/")):
            source = str((COMPOSE.parent / source).resolve())
        out.append((source, target))
    return out


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _listener(listeners: str, name: str) -> tuple[str, int]:
    """Host and port of listener `name` in a Kafka `listeners` value."""
    for listener in listeners.split(","):
        listener_name, _, address = listener.partition("://")
        if listener_name == name:
            return _host_port(address)
    raise AssertionError(f"no {name} listener in {listeners}")


def _dockerfile_stages() -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its (INSTRUCTION, arguments), a stage built `FROM` another starting
    with that stage's instructions (which is what it inherits)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", arguments.strip(), re.IGNORECASE)
            assert match, line
            image, name = match.groups()
            current = list(stages.get(image, [])) + [("FROM", image)]
            stages[name or f"stage{len(stages)}"] = current
        else:
            assert current is not None, f"{instruction} before FROM"
            current.append((instruction, arguments.strip()))
    return stages


def _last(stage: list[tuple[str, str]], instruction: str) -> str | None:
    values = [arguments for name, arguments in stage if name == instruction]
    return values[-1] if values else None


def _exec_form(arguments: str) -> list[str]:
    assert arguments.startswith("["), f"not exec form: {arguments}"
    return json.loads(arguments)


# --------------------------------------------------------------------------- the broker


def _kafka_version() -> str:
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", (ROOT / "testbed" / "pom.xml").read_text())
    assert match
    return match.group(1)


def test_kafka_is_the_official_image_in_kraft_mode_at_the_tested_version(services):
    kafka = services["kafka"]
    assert kafka["image"] == f"apache/kafka:{_kafka_version()}"
    env = _env(kafka)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    voter_id, _, voter = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].partition("@")
    assert voter_id == env["KAFKA_NODE_ID"]
    assert _host_port(voter) == ("kafka", _listener(env["KAFKA_LISTENERS"], env["KAFKA_CONTROLLER_LISTENER_NAMES"])[1])


def test_bootstrap_servers_is_the_kafka_services_internal_listener(services, config):
    env = _env(services["kafka"])
    internal = env["KAFKA_INTER_BROKER_LISTENER_NAME"]
    advertised = _listener(env["KAFKA_ADVERTISED_LISTENERS"], internal)
    assert advertised[0] in ("kafka", services["kafka"].get("hostname"))
    assert _listener(env["KAFKA_LISTENERS"], internal)[1] == advertised[1]
    assert [_host_port(s) for s in config["bootstrap.servers"]] == [advertised]


def test_the_tiered_topics_exist_with_unlimited_broker_retention(services, config):
    """The pipeline trims the broker with DeleteRecords: the broker itself must not."""
    command = _command(services["kafka-topics"])
    assert _host_port(_flag(command, "--bootstrap-server")) == tuple(_host_port(config["bootstrap.servers"][0]))
    created = {command[i + 1] for i, word in enumerate(command) if word == "--topic"}
    assert {t.name for t in config.tiered_topics} <= created
    assert "retention.ms=-1" in command
    assert services["pipeline"]["depends_on"]["kafka-topics"]["condition"] == "service_completed_successfully"


# --------------------------------------------------------------------------- object storage


def test_s3_endpoint_bucket_and_credentials_are_minios(services, config):
    assert config["remote.log.storage.backend"] == "s3"
    minio = services["minio"]
    endpoint = urlsplit(config["remote.log.storage.s3.endpoint.url"])
    assert endpoint.hostname == "minio"
    assert endpoint.port == _host_port(_flag(_command(minio), "--address"))[1]
    env = _env(minio)
    assert config["remote.log.storage.s3.access.key.id"] == env["MINIO_ROOT_USER"]
    assert config["remote.log.storage.s3.secret.access.key"] == env["MINIO_ROOT_PASSWORD"]

    # The one-shot job reaches the same MinIO with the same credentials and creates the bucket.
    job = services["minio-bucket"]
    assert job["depends_on"]["minio"]["condition"] == "service_healthy"
    aliases = {k.removeprefix("MC_HOST_"): urlsplit(v) for k, v in _env(job).items() if k.startswith("MC_HOST_")}
    command = _command(job, "entrypoint") + _command(job)
    assert command[:2] == ["mc", "mb"]
    alias, _, bucket = command[-1].partition("/")
    assert bucket == config["remote.log.storage.s3.bucket"]
    url = aliases[alias]
    assert (url.hostname, url.port) == (endpoint.hostname, endpoint.port)
    assert (url.username, url.password) == (env["MINIO_ROOT_USER"], env["MINIO_ROOT_PASSWORD"])
    for name in ("proxy", "pipeline"):
        assert services[name]["depends_on"]["minio-bucket"]["condition"] == "service_completed_successfully"


# --------------------------------------------------------------------------- proxy and pipeline


def test_one_configuration_file_mounted_where_the_commands_read_it(services):
    stages = _dockerfile_stages()
    for name, verb in (("proxy", "serve"), ("pipeline", "tier")):
        service = services[name]
        mounted = {target: source for source, target in _mounts(service)}
        command = _command(service)
        assert command[:2] == ["tierproxy", verb]
        path = _flag(command, "--config")
        assert mounted[path] == str(PROPERTIES.resolve()), f"{name} reads {path}, which is not the mounted file"
        # The image's own CMD reads the same path.
        target = service["build"]["target"]
        assert _flag(_exec_form(_last(stages[target], "CMD")), "--config") == path


def test_proxy_publishes_its_bootstrap_and_node_ports_on_loopback(services, config):
    node_id = int(_env(services["kafka"])["KAFKA_NODE_ID"])
    wanted = {config["proxy.bootstrap.port"], config["proxy.broker.port.base"] + node_id}
    ports = _ports(services["proxy"])
    assert {published for _, published, _ in ports} == wanted
    assert all(published == target and host_ip == "127.0.0.1" for host_ip, published, target in ports)
    assert config["proxy.listener.host"] == "0.0.0.0"  # reachable through the published ports
    assert config["proxy.advertised.host"] in ("localhost", "127.0.0.1")


def test_prometheus_scrapes_the_proxys_and_the_pipelines_metrics_port(services, config):
    prometheus = services["prometheus"]
    mounted = {target: source for source, target in _mounts(prometheus)}
    scrape = yaml.safe_load(Path(mounted[_flag(_command(prometheus), "--config.file")]).read_text())
    targets = {job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
               for job in scrape["scrape_configs"]}
    assert targets == {"tierproxy-proxy": [f"proxy:{config['metrics.port']}"],
                       "tierproxy-pipeline": [f"pipeline:{config['pipeline.metrics.port']}"]}
    for name, key in (("proxy", "metrics.port"), ("pipeline", "pipeline.metrics.port")):
        assert str(config[key]) in [str(p) for p in services[name].get("expose", [])]
        assert name in prometheus["depends_on"]


def test_prometheus_loads_the_rule_files_of_deploy_rules(services):
    """rule_files are relative to the configuration file: they must name the mounted rules."""
    prometheus = services["prometheus"]
    mounted = {target: source for source, target in _mounts(prometheus)}
    config_file = _flag(_command(prometheus), "--config.file")
    scrape = yaml.safe_load(Path(mounted[config_file]).read_text())
    rules = ROOT / "deploy" / "rules"
    loaded = set()
    for pattern in scrape["rule_files"]:
        in_container = Path(config_file).parent / pattern
        (source,) = [s for target, s in mounted.items() if in_container.parent == Path(target)]
        assert Path(source) == rules.resolve()
        loaded |= set(rules.glob(in_container.name))
    assert {p.name for p in loaded} == {"recording.rules.yml", "alerts.rules.yml"}


def test_pipeline_runs_on_spark_local_mode_every_task_interval(services, config):
    command = _command(services["pipeline"])
    every = _flag(command, "--every")
    match = re.fullmatch(r"(\d+)(ms|s|m)", every)
    assert match, every
    assert int(match.group(1)) * {"ms": 1, "s": 1000, "m": 60_000}[match.group(2)] == (
        config["remote.log.manager.task.interval.ms"])
    assert config["spark.master"].startswith("local")


def test_metadata_directory_is_a_volume_of_each_container_not_shared(services, config):
    directory = str(config["remote.log.metadata.dir"])
    assert config["remote.log.metadata.backend"] == "topic"  # the proxy and the pipeline share the topic
    sources = []
    for name in ("proxy", "pipeline"):
        (source,) = [s for s, target in _mounts(services[name]) if directory.startswith(target.rstrip("/") + "/")]
        sources.append(source)
    assert sources[0] != sources[1]


def test_dockerfile_runs_as_a_non_root_user_with_a_healthcheck(services):
    stages = _dockerfile_stages()
    assert _last(stages["base"], "FROM").startswith("python:3.11-slim")
    for name in ("proxy", "pipeline"):
        target = services[name]["build"]["target"]
        user = _last(stages[target], "USER")
        assert user is not None and user.split(":")[0] not in ("root", "0"), f"{target} runs as {user}"
    proxy_stage = stages[services["proxy"]["build"]["target"]]
    assert _last(proxy_stage, "HEALTHCHECK") or services["proxy"].get("healthcheck")
    # The last stage is what a plain `docker build .` makes: the proxy.
    assert list(stages)[-1] == services["proxy"]["build"]["target"]


def _pip_installs(stage: list[tuple[str, str]]) -> list[set[str]]:
    """The extras of each `pip install .[extras]` of a stage (an empty set for `.`)."""
    installs = []
    for name, arguments in stage:
        if name != "RUN":
            continue
        for command in re.split(r"&&|;", arguments):
            words = shlex.split(command)
            if words[:2] != ["pip", "install"]:
                continue
            for word in words[2:]:
                match = re.fullmatch(r"\.(?:\[([\w,\s-]*)\])?", word)
                if match:
                    installs.append({e.strip() for e in (match.group(1) or "").split(",") if e.strip()})
    return installs


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_each_image_installs_the_extras_its_service_runs(services):
    """The proxy image: the core and `[loadtest]` (so `tierproxy loadtest` runs in it), no
    Spark and no Java. The pipeline image: `[pipeline]` and a Java runtime."""
    stages = _dockerfile_stages()
    extras = set(_pyproject()["project"]["optional-dependencies"])
    proxy = stages[services["proxy"]["build"]["target"]]
    pipeline = stages[services["pipeline"]["build"]["target"]]
    assert _pip_installs(proxy) == [{"loadtest"}]
    assert _pip_installs(pipeline) == [{"pipeline"}]
    assert {"loadtest", "pipeline"} <= extras
    assert not any("openjdk" in arguments or "java" in arguments
                   for name, arguments in proxy if name == "RUN")
    assert any("openjdk-17-jre-headless" in arguments for name, arguments in pipeline if name == "RUN")


def test_the_images_hold_every_package_the_commands_import():
    """pyproject.toml's packages are COPYed (testbed, for tests only, may stay out) and
    .dockerignore keeps none of them out of the build context."""
    stages = _dockerfile_stages()
    copied = set()
    for name, arguments in stages["base"]:
        if name == "COPY":
            *sources, _ = shlex.split(arguments)
            copied |= {source.rstrip("/") for source in sources}
    package_dirs = set(_pyproject()["tool"]["setuptools"]["package-dir"].values())
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "testbed"}
    assert packages == package_dirs
    assert packages | {"pyproject.toml", "README.md"} <= copied, sorted(packages - copied)
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert not copied & ignored


def test_kafka_has_the_single_node_settings_of_the_testbed(services):
    """Every internal topic (offsets, transactions, share groups) can be created on one
    node: the replication factor and min ISR testbed/kafka.py sets, in the apache/kafka
    image's environment form (KAFKA_ + the key upper-cased, dots as underscores)."""
    keys = set(re.findall(r'"([a-z.]+\.(?:replication\.factor|min\.isr))"',
                          (ROOT / "testbed" / "kafka.py").read_text()))
    assert "share.coordinator.state.topic.replication.factor" in keys
    env = _env(services["kafka"])
    for key in sorted(keys):
        variable = "KAFKA_" + key.upper().replace(".", "_")
        assert env.get(variable) == "1", f"{variable} (the broker's {key}) must be 1 on one node"


def test_the_pipeline_container_runs_an_init(services):
    """Spark starts a JVM and Python workers: an init reaps them and forwards SIGTERM."""
    assert services["pipeline"].get("init") is True


def test_the_proxy_healthcheck_detects_a_closed_bootstrap_port(tmp_path):
    """Runs the Dockerfile's HEALTHCHECK command here, against a configuration whose
    bootstrap port is first listening, then closed."""
    health = _last(_dockerfile_stages()["proxy"], "HEALTHCHECK")
    command = _exec_form(health[health.index("CMD") + len("CMD"):].strip())
    assert command[0] == "python"
    container_path = command[-1]
    assert container_path == "/etc/tierproxy/tierproxy.properties"

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    properties = tmp_path / "tierproxy.properties"
    properties.write_text(f"bootstrap.servers=127.0.0.1:1\nproxy.bootstrap.port={port}\n")
    argv = [sys.executable, *command[1:-1], str(properties)]
    try:
        assert subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=30).returncode == 0
    finally:
        listener.close()
    assert subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=30).returncode != 0


# --------------------------------------------------------------------------- the Compose Specification

COMPOSE_SCHEMA = "vendor.compose-spec"


def _check_compose_schema(path: Path) -> subprocess.CompletedProcess:
    """check-jsonschema with its vendored Compose Specification schema: no network."""
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", COMPOSE_SCHEMA, str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


def test_the_compose_schema_is_the_vendored_compose_specification():
    schema = json.loads((files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text())
    assert schema["title"] == "Compose Specification"
    assert "services" in schema["properties"]
    assert schema.get("additionalProperties") is False  # unknown top-level keys are errors


def test_docker_compose_yml_follows_the_compose_specification():
    result = _check_compose_schema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("broken", "old", "new", "reported"), [
    ("an unknown top-level key", "\nservices:\n", "\nservicez:\n", "'servicez'"),
    ("ports not a list", '    ports:\n      - "127.0.0.1:9192:9192"  # proxy.bootstrap.port\n'
                         '      - "127.0.0.1:9194:9194"  # proxy.broker.port.base + node id 1\n',
     '    ports: "x"\n', "$.services.proxy.ports"),
    ("an unknown service key", "    restart: unless-stopped\n", "    restrat: unless-stopped\n", "'restrat'"),
])
def test_the_schema_check_rejects_a_broken_compose_file(tmp_path, broken, old, new, reported):
    text = COMPOSE.read_text()
    assert old in text, f"cannot make {broken}: {old!r} is not in {COMPOSE.name}"
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(text.replace(old, new, 1))
    assert yaml.safe_load(bad.read_text())  # still YAML: only the schema can reject it
    result = _check_compose_schema(bad)
    output = result.stdout + result.stderr
    assert result.returncode != 0, f"{broken} accepted:\n{output}"
    assert "Schema validation errors" in output and reported in output, output
