"""Run the testbed outside of tests (demo, benchmarks).

    python -m testbed up [--brokers N] [--s3] [-c key=value ...] [--state PATH]
                         [--secure [--user NAME=PASSWORD ...]]
    python -m testbed status [--state PATH]
    python -m testbed down [--state PATH]

``up`` starts the servers detached (they outlive the command), writes pids,
ports and addresses to the state file (default ``<cache>/testbed-state.json``)
and prints it. Server files live in ``<state file without .json>.d/``.
``status`` prints the state with, per process, whether it runs and answers
(ApiVersions for brokers, HTTP for S3); exit status 1 if anything is down.
``down`` stops every recorded process by pid and removes the state and files.

``up --secure`` starts the secured cluster (SASL_SSL on the bootstrap port,
an MTLS listener, a fresh CA; see ``testbed.kafka``) with ``admin`` and the
``--user`` users. The state then also holds the users, the PEM files, and
tierproxy's configuration to reach the cluster over SASL (as admin) and over
mutual TLS, both also written as ``.properties`` files to pass to tierproxy.
``status`` probes such brokers on their PLAINTEXT internal port.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import javaproperties

from testbed import jars, probe
from testbed.iceberg_rest import ICEBERG_VERSION, iceberg_rest_libs
from testbed.kafka import KafkaCluster
from testbed.processes import cmdline, is_alive, stop_pids
from testbed.s3 import S3Server


def default_state_path() -> Path:
    return jars.cache_dir() / "testbed-state.json"


def _run_dir(state_path: Path) -> Path:
    return state_path.with_suffix(".d")


def _read_state(state_path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(state_path.read_text())
    except FileNotFoundError:
        return None


def _recorded_processes(state: dict[str, Any]) -> list[tuple[int, str]]:
    """(pid, what its command line must contain) for every recorded process."""
    processes = [(b["pid"], "kafka.Kafka") for b in state["kafka"]["brokers"]]
    if state.get("s3"):
        processes.append((state["s3"]["pid"], "moto_server"))
    return processes


def _ours(pid: int, marker: str) -> bool:
    # A pid may have been reused since `up`; never signal a stranger.
    return is_alive(pid) and any(marker in part for part in cmdline(pid))


def up(args: argparse.Namespace) -> int:
    state_path: Path = args.state
    state = _read_state(state_path)
    if state is not None:
        if any(_ours(pid, marker) for pid, marker in _recorded_processes(state)):
            print(f"already up (see {state_path}); run `python -m testbed down` first",
                  file=sys.stderr)
            return 1
        shutil.rmtree(_run_dir(state_path), ignore_errors=True)  # left by a crashed run
    broker_config = dict(item.split("=", 1) for item in args.broker_config)
    run_dir = _run_dir(state_path)
    secure: dict[str, Any] = {}
    if args.secure:
        secure = {"secure": True, "users": dict(item.split("=", 1) for item in args.user)}
    cluster = KafkaCluster(args.brokers, broker_config=broker_config,
                           workdir=run_dir / "kafka", detached=True, **secure)
    cluster.start()
    s3 = None
    try:
        secure_state = _secure_state(cluster, run_dir) if cluster.secure else {}
        if args.s3:
            s3 = S3Server(workdir=run_dir / "s3", detached=True).start()
    except BaseException:
        cluster.stop()
        raise
    state = {
        "workdir": str(run_dir),
        "kafka": {
            "version": cluster.version,
            "cluster_id": cluster.cluster_id,
            "bootstrap_servers": cluster.bootstrap_servers,
            "brokers": [
                {"node_id": node_id, "host": host, "port": port,
                 "pid": cluster.pids[node_id], "log_dir": str(cluster.log_dirs[node_id]),
                 **_secure_ports(cluster, node_id)}
                for node_id, host, port in cluster.brokers
            ],
            **secure_state,
        },
        "s3": None if s3 is None else {
            "endpoint_url": s3.endpoint_url, "port": s3.port, "bucket": s3.bucket,
            "region": s3.region, "access_key": s3.access_key, "secret_key": s3.secret_key,
            "pid": s3.pid,
        },
    }
    state_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = state_path.with_name(state_path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.rename(state_path)
    print(json.dumps(state, indent=2))
    return 0


def _secure_ports(cluster: KafkaCluster, node_id: int) -> dict[str, int]:
    if not cluster.secure:
        return {}
    ports = cluster.listener_ports[node_id]
    return {"internal_port": ports["INTERNAL"], "mtls_port": ports["MTLS"]}


def _secure_state(cluster: KafkaCluster, run_dir: Path) -> dict[str, Any]:
    """What a client of the secured cluster needs, and tierproxy's settings as files."""
    tierproxy = {"sasl": cluster.tierproxy_properties(), "mtls": cluster.tierproxy_properties(mtls=True)}
    files = {}
    for name, props in tierproxy.items():
        path = run_dir / f"tierproxy-{name}.properties"
        with open(path, "w", encoding="utf-8") as f:
            javaproperties.dump(props, f, timestamp=False)
        files[name] = str(path)
    return {
        "security_protocol": cluster.client_security_protocol,
        "sasl_mechanisms": list(cluster.sasl_mechanisms),
        "users": cluster.sasl_plain_users,
        "mtls_bootstrap_servers": cluster.mtls_bootstrap_servers,
        "tls": {k: str(v) for k, v in dataclasses.asdict(cluster.tls).items()},
        "tierproxy_properties": tierproxy,
        "tierproxy_properties_files": files,
    }


def status(args: argparse.Namespace) -> int:
    state = _read_state(args.state)
    if state is None:
        print(f"not up (no {args.state})")
        return 1
    healthy = True
    for broker in state["kafka"]["brokers"]:
        broker["alive"] = _ours(broker["pid"], "kafka.Kafka")
        # A secured broker's bootstrap port wants TLS; its INTERNAL listener is plaintext.
        port = broker.get("internal_port", broker["port"])
        broker["answers_api_versions"] = probe.answers(broker["host"], port)
        healthy &= broker["alive"] and broker["answers_api_versions"]
    if state.get("s3"):
        s3 = state["s3"]
        s3["alive"] = _ours(s3["pid"], "moto_server")
        s3["answers_http"] = S3Server(port=s3["port"]).answers()
        healthy &= s3["alive"] and s3["answers_http"]
    print(json.dumps(state, indent=2))
    return 0 if healthy else 1


def down(args: argparse.Namespace) -> int:
    state_path: Path = args.state
    state = _read_state(state_path)
    if state is None:
        print(f"nothing to stop (no {state_path})")
        return 0
    pids = [pid for pid, marker in _recorded_processes(state) if _ours(pid, marker)]
    stop_pids(pids)
    shutil.rmtree(state["workdir"], ignore_errors=True)
    state_path.unlink()
    print(f"stopped pids {pids}")
    return 0


def resolve_jars(args: argparse.Namespace) -> int:
    """Resolve the Kafka jars and the Iceberg REST catalog server's now (from Maven Central, once per version)."""
    libs = jars.kafka_libs(jars.KAFKA_VERSION)
    print(f"Apache Kafka {jars.KAFKA_VERSION}: {sum(1 for _ in libs.glob('*.jar'))} jars in {libs}")
    libs = iceberg_rest_libs()
    print(f"Apache Iceberg {ICEBERG_VERSION} REST catalog: {sum(1 for _ in libs.glob('*.jar'))} jars in {libs}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state", type=Path, default=None,
                        help="state file (default <cache>/testbed-state.json)")
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="start Kafka (and S3) detached")
    start.add_argument("--brokers", type=int, default=1)
    start.add_argument("--s3", action="store_true", help="also start moto's S3 server")
    start.add_argument("-c", "--broker-config", action="append", default=[],
                       metavar="KEY=VALUE", help="broker setting, repeatable")
    start.add_argument("--secure", action="store_true",
                       help="SASL_SSL (SCRAM, PLAIN) and mutual TLS listeners, a fresh CA")
    start.add_argument("--user", action="append", default=[], metavar="NAME=PASSWORD",
                       help="a SASL user besides admin (with --secure), repeatable")
    commands.add_parser("status", help="show the state and whether it is healthy")
    commands.add_parser("down", help="stop everything and remove the state")
    commands.add_parser("jars", help="resolve the Kafka jars and the Iceberg REST catalog's from Maven Central into the cache")
    for sub in commands.choices.values():
        sub.add_argument("--state", type=Path, default=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.state is None:
        args.state = default_state_path()
    for item in getattr(args, "broker_config", []):
        if "=" not in item:
            parser.error(f"--broker-config wants KEY=VALUE, got {item!r}")
    for item in getattr(args, "user", []):
        if "=" not in item:
            parser.error(f"--user wants NAME=PASSWORD, got {item!r}")
    if getattr(args, "user", []) and not args.secure:
        parser.error("--user needs --secure")
    return {"up": up, "status": status, "down": down, "jars": resolve_jars}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
