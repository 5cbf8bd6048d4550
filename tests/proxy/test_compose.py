"""docker-compose.yml, the Dockerfile and deploy/ agree with each other.

No Docker engine runs here, so this reads the files: the compose file, the one
configuration file mounted into the proxy and the pipeline (loaded with config, so
every key in it must be valid), Prometheus' configuration and the Dockerfile, and checks
that hosts, ports, the bucket, the credentials and the mounted path are the same
everywhere. `docker compose config` runs too when a compose plugin is installed.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from config import Config, load

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


def test_prometheus_scrapes_the_proxys_metrics_port(services, config):
    prometheus = services["prometheus"]
    mounted = {target: source for source, target in _mounts(prometheus)}
    scrape = yaml.safe_load(Path(mounted[_flag(_command(prometheus), "--config.file")]).read_text())
    targets = [t for job in scrape["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [f"proxy:{config['metrics.port']}"]
    assert str(config["metrics.port"]) in [str(p) for p in services["proxy"].get("expose", [])]


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
    pipeline_stage = stages[services["pipeline"]["build"]["target"]]
    assert any("openjdk-17-jre-headless" in arguments for name, arguments in pipeline_stage if name == "RUN")
    assert "pip install ." in " ".join(arguments for name, arguments in stages["base"] if name == "RUN")
    # The last stage is what a plain `docker build .` makes: the proxy.
    assert list(stages)[-1] == services["proxy"]["build"]["target"]


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


def _compose_plugin() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    result = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
    return result.returncode == 0


def test_docker_compose_config_accepts_the_file():
    if not _compose_plugin():
        pytest.skip("no docker compose plugin on this machine")
    result = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "-q"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
