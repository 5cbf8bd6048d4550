"""A real Apache Kafka cluster (KRaft, combined mode) on 127.0.0.1.

Every node runs ``process.roles=broker,controller`` in its own JVM; the static
controller quorum (``controller.quorum.voters``) spans all nodes. Node ids are
``first_node_id`` .. ``first_node_id`` + n - 1 (0 .. n-1 by default; real clusters
often number from 1 or 1001). Each node has three listeners on free ports chosen at start:

- ``CLIENT``: what ``bootstrap_servers`` names and what Metadata returns.
  PLAINTEXT, or SASL_PLAINTEXT with the PLAIN mechanism when
  ``sasl_plain_users`` is given, or SASL_SSL with SCRAM-SHA-256,
  SCRAM-SHA-512 and PLAIN when ``secure=True`` (``users``).
- ``INTERNAL``: PLAINTEXT, replication between brokers.
- ``CONTROLLER``: PLAINTEXT, the KRaft quorum.
- ``MTLS`` (``secure=True`` only): SSL with ``ssl.client.auth=required``;
  ``ssl.principal.mapping.rules`` turns the certificate's ``CN=tierproxy``
  into ``User:tierproxy``. ``mtls_bootstrap_servers`` names it.

With SASL the cluster also runs ``StandardAuthorizer`` with
``super.users=User:admin;User:ANONYMOUS`` (and ``User:tierproxy`` when
secure): ``admin`` (added with password ``admin-secret`` unless given) may do
anything, any other user needs ACLs, and ANONYMOUS is the principal of the
PLAINTEXT internal and controller listeners, so brokers and controllers may
talk to each other. Metadata answers with the listener the request came in
on, so clients see only CLIENT (or only MTLS) addresses.

Secured, the testbed makes a fresh CA at start (``testbed.tls``; the PEM
files are in ``workdir/tls``, paths in ``tls``). SCRAM credentials exist for
every user from the start: ``kafka-storage format --add-scram`` writes them
into the bootstrap metadata. ``client_config``, ``client_properties`` and
``tierproxy_properties`` give librdkafka, Java and tierproxy what they need.

Files live in ``workdir`` (a temporary directory removed by ``stop()`` unless
one is given): ``node-<id>/server.properties``, ``node-<id>/data`` (the log
dir), ``node-<id>/server.log`` (log4j2) and ``node-<id>/stdout.log``.
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import struct
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

import javaproperties

from testbed import jars, probe
from testbed.ports import LOOPBACK, free_ports
from testbed.processes import log_tail, spawn, stop_pids
from testbed.tls import CLIENT_COMMON_NAME, TlsFiles, write_tls_files

DEFAULT_JVM_OPTIONS: tuple[str, ...] = (
    # Three brokers must fit on a small machine next to the tests.
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
TOOL_TIMEOUT_S = 60.0
ADMIN_USER = "admin"
ADMIN_DEFAULT_PASSWORD = "admin-secret"
SCRAM_MECHANISMS: tuple[str, ...] = ("SCRAM-SHA-256", "SCRAM-SHA-512")
SECURE_MECHANISMS: tuple[str, ...] = (*SCRAM_MECHANISMS, "PLAIN")
# CN=tierproxy,O=... (RFC 2253, as Kafka prints a certificate's subject) -> tierproxy
PRINCIPAL_MAPPING_RULES = "RULE:^CN=([^,]+).*$/$1/,DEFAULT"
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}

_BROKER_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
"""

# Tools print their results on stdout; keep their logging out of it.
_TOOLS_LOG4J2 = """\
status = warn
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
"""


class KafkaStartError(RuntimeError):
    pass


def java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise KafkaStartError("java is not installed (Kafka needs Java 17+)")
    return java


def _random_cluster_id() -> str:
    # Like Kafka's Uuid.randomUuid: never starting with "-", which command lines
    # would read as an option.
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class _Node:
    def __init__(self, node_id: int, home: Path, client_port: int,
                 internal_port: int, controller_port: int,
                 mtls_port: int | None = None) -> None:
        self.node_id = node_id
        self.home = home
        self.client_port = client_port
        self.internal_port = internal_port
        self.controller_port = controller_port
        self.mtls_port = mtls_port
        self.process: subprocess.Popen | None = None

    @property
    def log_dir(self) -> Path:
        return self.home / "data"

    @property
    def properties(self) -> Path:
        return self.home / "server.properties"

    @property
    def server_log(self) -> Path:
        return self.home / "server.log"

    @property
    def stdout_log(self) -> Path:
        return self.home / "stdout.log"


class KafkaCluster:
    """``brokers`` KRaft nodes; ``broker_config`` overrides any default below.

    ``sasl_plain_users`` (SASL_PLAINTEXT, PLAIN) and ``secure=True`` with
    ``users`` (SASL_SSL and MTLS) exclude each other; both map user names to
    passwords and add ``admin``.
    """

    def __init__(
        self,
        brokers: int = 1,
        *,
        broker_config: Mapping[str, Any] | None = None,
        workdir: Path | None = None,
        sasl_plain_users: Mapping[str, str] | None = None,
        secure: bool = False,
        users: Mapping[str, str] | None = None,
        version: str = jars.KAFKA_VERSION,
        jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
        start_timeout: float = START_TIMEOUT_S,
        detached: bool = False,
        first_node_id: int = 0,
    ) -> None:
        if brokers < 1:
            raise ValueError(f"brokers must be >= 1, got {brokers}")
        if first_node_id < 0:
            raise ValueError(f"first_node_id must be >= 0, got {first_node_id}")
        self._count = brokers
        self._first_node_id = first_node_id
        self._overrides = {k: str(v) for k, v in (broker_config or {}).items()}
        self._given_workdir = Path(workdir) if workdir is not None else None
        self._workdir: Path | None = self._given_workdir
        if secure and sasl_plain_users is not None:
            raise ValueError("secure=True takes its SASL users as users=, not sasl_plain_users=")
        if users is not None and not secure:
            raise ValueError("users= needs secure=True (sasl_plain_users= for SASL_PLAINTEXT)")
        self.secure = secure
        self._sasl_users: dict[str, str] | None = None
        given = users if secure else sasl_plain_users
        if secure or given is not None:
            self._sasl_users = {ADMIN_USER: ADMIN_DEFAULT_PASSWORD, **(given or {})}
            for user, password in self._sasl_users.items():
                # They go unescaped into JAAS options and --add-scram's [name=..,password=..].
                if not user or any(c in user + password for c in '"\\;=,[]'):
                    raise ValueError(f"SASL user {user!r}: not empty, no quotes, backslashes, "
                                     "';', '=', ',' or brackets")
        self._tls: TlsFiles | None = None
        self.version = version
        self._jvm_options = tuple(jvm_options)
        self._start_timeout = start_timeout
        # Detached nodes outlive this Python process (python -m testbed up).
        self._detached = detached
        self._nodes: list[_Node] = []
        self._libs: Path | None = None
        self._admin: Any = None
        self.cluster_id = _random_cluster_id()

    # -- addresses ---------------------------------------------------------

    @property
    def workdir(self) -> Path:
        self._require_started()
        assert self._workdir is not None
        return self._workdir

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{host}:{port}" for _, host, port in self.brokers)

    @property
    def brokers(self) -> list[tuple[int, str, int]]:
        """(node id, host, client port) for every node."""
        self._require_started()
        return [(n.node_id, LOOPBACK, n.client_port) for n in self._nodes]

    @property
    def log_dirs(self) -> dict[int, Path]:
        self._require_started()
        return {n.node_id: n.log_dir for n in self._nodes}

    @property
    def pids(self) -> dict[int, int]:
        self._require_started()
        return {n.node_id: n.process.pid for n in self._nodes if n.process is not None}

    @property
    def listener_ports(self) -> dict[int, dict[str, int]]:
        """Port by listener name (CLIENT, INTERNAL, CONTROLLER, MTLS) for every node."""
        self._require_started()
        return {n.node_id: {"CLIENT": n.client_port, "INTERNAL": n.internal_port,
                            "CONTROLLER": n.controller_port,
                            **({"MTLS": n.mtls_port} if n.mtls_port is not None else {})}
                for n in self._nodes}

    @property
    def mtls_bootstrap_servers(self) -> str:
        """The MTLS listener of every node (``secure=True``)."""
        self._require_secure()
        return ",".join(f"{LOOPBACK}:{n.mtls_port}" for n in self._nodes)

    @property
    def sasl_plain_users(self) -> dict[str, str] | None:
        """Every SASL user and password (PLAIN works in both SASL modes), admin included."""
        return dict(self._sasl_users) if self._sasl_users is not None else None

    @property
    def sasl_mechanisms(self) -> tuple[str, ...]:
        """What the CLIENT listener accepts; the first is the helpers' default."""
        if self.secure:
            return SECURE_MECHANISMS
        return ("PLAIN",) if self._sasl_users is not None else ()

    @property
    def tls(self) -> TlsFiles:
        """The CA, broker and client PEM files (``secure=True``)."""
        self._require_secure()
        assert self._tls is not None
        return self._tls

    @property
    def client_security_protocol(self) -> str:
        if self.secure:
            return "SASL_SSL"
        return "SASL_PLAINTEXT" if self._sasl_users is not None else "PLAINTEXT"

    def client_config(self, user: str = ADMIN_USER, mechanism: str | None = None) -> dict[str, str]:
        """librdkafka (confluent_kafka) settings to reach the CLIENT listener as ``user``.

        ``mechanism`` defaults to the first of ``sasl_mechanisms``
        (SCRAM-SHA-256 when secure, PLAIN with ``sasl_plain_users``).
        """
        config = {"bootstrap.servers": self.bootstrap_servers}
        if self._sasl_users is not None:
            config.update({
                "security.protocol": self.client_security_protocol,
                "sasl.mechanism": self._mechanism(mechanism),
                "sasl.username": user,
                "sasl.password": self._password(user),
            })
        if self.secure:
            config["ssl.ca.location"] = str(self.tls.ca)
        return config

    def mtls_client_config(self) -> dict[str, str]:
        """librdkafka settings to reach the MTLS listener with the client certificate."""
        return {
            "bootstrap.servers": self.mtls_bootstrap_servers,
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.tls.ca),
            "ssl.certificate.location": str(self.tls.client_cert),
            "ssl.key.location": str(self.tls.client_key),
        }

    def client_properties(self, user: str = ADMIN_USER, mechanism: str | None = None) -> Path:
        """A Java client properties file for ``user`` (``--command-config`` of the tools)."""
        props: dict[str, str] = {"bootstrap.servers": self.bootstrap_servers}
        name = f"client-{user}"
        if self._sasl_users is not None:
            mechanism = self._mechanism(mechanism)
            props.update({
                "security.protocol": self.client_security_protocol,
                "sasl.mechanism": mechanism,
                "sasl.jaas.config": (
                    f"{_LOGIN_MODULES[mechanism]} required "
                    f'username="{user}" password="{self._password(user)}";'
                ),
            })
            if self.secure:
                name += f"-{mechanism}"
        if self.secure:
            props.update({"ssl.truststore.type": "PEM",
                          "ssl.truststore.location": str(self.tls.ca)})
        path = self.workdir / f"{name}.properties"
        _write_properties(path, props)
        return path

    def tierproxy_properties(self, user: str = ADMIN_USER, mechanism: str | None = None,
                             mtls: bool = False) -> dict[str, str]:
        """tierproxy's configuration keys for its own connections to this cluster.

        The CLIENT listener as ``user``, or with ``mtls`` the MTLS listener as
        the certificate's principal (``User:tierproxy``, a super user).
        tierproxy reads librdkafka's spellings of these keys, so today this is
        ``client_config`` or ``mtls_client_config``; it is its own method
        because tierproxy's configuration is its own contract.
        """
        if mtls:
            return self.mtls_client_config()
        return self.client_config(user, mechanism)

    def _mechanism(self, mechanism: str | None) -> str:
        enabled = self.sasl_mechanisms
        if mechanism is None:
            return enabled[0]
        if mechanism not in enabled:
            raise ValueError(f"SASL mechanism {mechanism!r} is not enabled here: {enabled}")
        return mechanism

    def _password(self, user: str) -> str:
        assert self._sasl_users is not None
        try:
            return self._sasl_users[user]
        except KeyError:
            raise ValueError(f"no SASL user {user!r}; users: {sorted(self._sasl_users)}") from None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> "KafkaCluster":
        if self._nodes:
            raise RuntimeError("cluster already started")
        self._libs = jars.kafka_libs(self.version)
        if self._given_workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="tierproxy-kafka-"))
        else:
            self._workdir = self._given_workdir
            self._workdir.mkdir(parents=True, exist_ok=True)
        per_node = 4 if self.secure else 3
        ports = free_ports(per_node * self._count)
        self._nodes = [
            _Node(self._first_node_id + i, self._workdir / f"node-{self._first_node_id + i}",
                  *ports[per_node * i:per_node * (i + 1)])
            for i in range(self._count)
        ]
        if self.secure:
            self._tls = write_tls_files(self._workdir / "tls")
        (self._workdir / "log4j2.properties").write_text(_BROKER_LOG4J2)
        (self._workdir / "tools-log4j2.properties").write_text(_TOOLS_LOG4J2)
        if not self._detached:
            atexit.register(self._stop_at_exit)
        try:
            for node in self._nodes:
                node.home.mkdir(parents=True, exist_ok=True)
                _write_properties(node.properties, self._server_properties(node))
            self._format()
            for node in self._nodes:
                node.process = spawn(
                    self._java_command("kafka.Kafka", str(node.properties),
                                       log4j2=self._workdir / "log4j2.properties",
                                       logs_dir=node.home),
                    node.stdout_log, detached=self._detached,
                )
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop every node by pid (SIGTERM, then SIGKILL after ``timeout``)."""
        self._admin = None
        atexit.unregister(self._stop_at_exit)
        pids = [n.process.pid for n in self._nodes if n.process is not None]
        try:
            stop_pids(pids, timeout=timeout)
        finally:
            for node in self._nodes:
                if node.process is not None:
                    node.process.poll()  # reap, if the pid was not reaped already
            self._nodes = []
            if self._given_workdir is None and self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None

    def _stop_at_exit(self) -> None:
        try:
            self.stop(timeout=5.0)
        except Exception:  # noqa: BLE001 - interpreter is exiting; nothing left to report to
            pass

    def __enter__(self) -> "KafkaCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _require_started(self) -> None:
        if not self._nodes:
            raise RuntimeError("cluster is not started")

    def _require_secure(self) -> None:
        if not self.secure:
            raise RuntimeError("only a cluster started with secure=True has TLS and MTLS")
        self._require_started()

    # -- configuration -----------------------------------------------------

    def _server_properties(self, node: _Node) -> dict[str, str]:
        n = self._count
        rf = str(min(3, n))
        voters = ",".join(f"{m.node_id}@{LOOPBACK}:{m.controller_port}" for m in self._nodes)
        protocols = {"CLIENT": self.client_security_protocol, "INTERNAL": "PLAINTEXT",
                     "CONTROLLER": "PLAINTEXT"}
        ports = {"CLIENT": node.client_port, "INTERNAL": node.internal_port,
                 "CONTROLLER": node.controller_port}
        if node.mtls_port is not None:
            protocols["MTLS"] = "SSL"
            ports["MTLS"] = node.mtls_port
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": ",".join(f"{name}://{LOOPBACK}:{port}" for name, port in ports.items()),
            "advertised.listeners": ",".join(
                f"{name}://{LOOPBACK}:{port}" for name, port in ports.items()
                if name != "CONTROLLER"),
            "listener.security.protocol.map": ",".join(
                f"{name}:{protocol}" for name, protocol in protocols.items()),
            "inter.broker.listener.name": "INTERNAL",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(node.log_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": rf,
            # Kafka's 50 partitions make the first consumer group slow to start.
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "5",
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
        }
        if self._sasl_users is not None:
            users = " ".join(f'user_{u}="{p}"' for u, p in self._sasl_users.items())
            mechanisms = ",".join(self.sasl_mechanisms)
            super_users = [ADMIN_USER, "ANONYMOUS"] + ([CLIENT_COMMON_NAME] if self.secure else [])
            props.update({
                "sasl.enabled.mechanisms": mechanisms,
                "listener.name.client.sasl.enabled.mechanisms": mechanisms,
                "listener.name.client.plain.sasl.jaas.config": (
                    f"{_LOGIN_MODULES['PLAIN']} required {users};"
                ),
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": ";".join(f"User:{u}" for u in super_users),
            })
        if self.secure:
            assert self._tls is not None
            props.update({
                # SCRAM's server side needs only the login module; the
                # credentials are in the metadata log (see _format).
                **{f"listener.name.client.{m.lower()}.sasl.jaas.config":
                   f"{_LOGIN_MODULES[m]} required;" for m in SCRAM_MECHANISMS},
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(self._tls.broker_keystore),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self._tls.ca),
                "listener.name.mtls.ssl.client.auth": "required",
                "ssl.principal.mapping.rules": PRINCIPAL_MAPPING_RULES,
            })
        props.update(self._overrides)
        return props

    def _java_command(self, main_class: str, *args: str, log4j2: Path,
                      logs_dir: Path | None = None,
                      jvm_options: Sequence[str] | None = None) -> list[str]:
        assert self._libs is not None
        cmd = [java_binary(), *(self._jvm_options if jvm_options is None else jvm_options),
               f"-Dlog4j2.configurationFile={log4j2}"]
        if logs_dir is not None:
            cmd.append(f"-Dkafka.logs.dir={logs_dir}")
        return [*cmd, "-cp", jars.classpath(self._libs), main_class, *args]

    def _format(self) -> None:
        """``kafka-storage format`` for every node, in parallel: each is a JVM start."""
        assert self._workdir is not None
        tools_log4j2 = self._workdir / "tools-log4j2.properties"
        scram: list[str] = []
        if self.secure:
            assert self._sasl_users is not None
            for user, password in self._sasl_users.items():
                for mechanism in SCRAM_MECHANISMS:
                    scram += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
        running = [
            (node, subprocess.Popen(
                self._java_command("kafka.tools.StorageTool", "format",
                                   "--config", str(node.properties),
                                   "--cluster-id", self.cluster_id, *scram,
                                   log4j2=tools_log4j2, jvm_options=("-Xmx256m",)),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True,
            ))
            for node in self._nodes
        ]
        failures = []
        for node, process in running:
            try:
                output, _ = process.communicate(timeout=TOOL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                output, _ = process.communicate()
            if process.returncode != 0:
                failures.append(f"node {node.node_id} (exit {process.returncode}):\n{output}")
        if failures:
            raise KafkaStartError("formatting the KRaft storage failed:\n" + "\n".join(failures))

    def _wait_until_serving(self) -> None:
        """Until every node answers ApiVersions and its Metadata lists all nodes.

        A KRaft broker accepts requests only once it caught up with the
        metadata log and the controller unfenced it; nodes that came up early
        still have to learn about the later ones before clients see one cluster.
        """
        deadline = time.monotonic() + self._start_timeout
        waiting = list(self._nodes)
        while waiting:
            for node in list(waiting):
                assert node.process is not None
                if node.process.poll() is not None:
                    raise KafkaStartError(self._startup_report(
                        node, f"node {node.node_id} exited with {node.process.returncode}"))
                if self._knows_everyone(node):
                    waiting.remove(node)
            if not waiting:
                return
            if time.monotonic() > deadline:
                node = waiting[0]
                raise KafkaStartError(self._startup_report(
                    node, f"node {node.node_id} on {LOOPBACK}:{self._probe_port(node)} did not "
                    f"answer ApiVersions, or not list all {self._count} nodes in Metadata, "
                    f"within {self._start_timeout:.0f} s"))
            time.sleep(0.1)

    def _probe_port(self, node: _Node) -> int:
        # The probe speaks plaintext; a secure CLIENT listener wants TLS first.
        # All data-plane listeners start accepting together, so INTERNAL tells.
        return node.internal_port if self.secure else node.client_port

    def _knows_everyone(self, node: _Node) -> bool:
        if not probe.answers(LOOPBACK, self._probe_port(node), timeout=1.0):
            return False
        if self._count == 1:
            return True
        # Asked on INTERNAL (always PLAINTEXT): Metadata on a SASL CLIENT
        # listener would need a login first.
        try:
            listed = probe.metadata_brokers(LOOPBACK, node.internal_port, timeout=1.0)
        except (OSError, probe.ProbeError, struct.error):
            return False
        return sorted(node_id for node_id, _, _ in listed) == [n.node_id for n in self._nodes]

    def _startup_report(self, node: _Node, reason: str) -> str:
        return (f"Kafka {self.version} did not start: {reason}\n"
                f"--- {node.server_log} (tail) ---\n{log_tail(node.server_log)}\n"
                f"--- {node.stdout_log} (tail) ---\n{log_tail(node.stdout_log, 20)}")

    # -- topics and tools --------------------------------------------------

    def admin(self) -> Any:
        """A confluent_kafka AdminClient for the CLIENT listener (as ``admin`` with SASL)."""
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(self.client_config())
        return self._admin

    def create_topic(self, name: str, partitions: int = 1, replication: int = 1,
                     config: Mapping[str, Any] | None = None,
                     timeout: float = 30.0) -> None:
        """Create ``name`` and wait until every partition has a leader."""
        from confluent_kafka.admin import NewTopic

        new = NewTopic(name, num_partitions=partitions, replication_factor=replication,
                       config={k: str(v) for k, v in (config or {}).items()})
        self.admin().create_topics([new], operation_timeout=timeout)[name].result(timeout)
        self._wait_for_metadata(
            lambda topics: name in topics
            and topics[name].error is None
            and len(topics[name].partitions) == partitions
            and all(p.leader >= 0 and p.error is None for p in topics[name].partitions.values()),
            f"topic {name} has no leader for all {partitions} partitions", timeout)

    def delete_topic(self, name: str, timeout: float = 30.0) -> None:
        """Delete ``name`` and wait until Metadata no longer lists it."""
        self.admin().delete_topics([name], operation_timeout=timeout)[name].result(timeout)
        self._wait_for_metadata(lambda topics: name not in topics,
                                f"topic {name} is still listed after deletion", timeout)

    def _wait_for_metadata(self, done: Any, failure: str, timeout: float) -> None:
        # All topics, never one by name: a Metadata request naming a missing
        # topic may create it again (auto.create.topics.enable).
        deadline = time.monotonic() + timeout
        while True:
            topics = self.admin().list_topics(timeout=max(1.0, deadline - time.monotonic())).topics
            if done(topics):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{failure} after {timeout:.0f} s")
            time.sleep(0.1)

    def java_tool(self, main_class: str, *args: str, timeout: float = TOOL_TIMEOUT_S,
                  input: str | None = None) -> subprocess.CompletedProcess:
        """Run a Kafka tool class on the broker's classpath; output is captured as text.

        e.g. ``java_tool("org.apache.kafka.tools.GetOffsetShell",
        "--bootstrap-server", cluster.bootstrap_servers, "--topic", "t")``.
        Raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds.
        """
        self._require_started()
        return subprocess.run(
            self.java_tool_command(main_class, *args),
            input=input, stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout,
        )

    def java_tool_command(self, main_class: str, *args: str) -> list[str]:
        """The command line `java_tool` runs, for a tool that runs beside the test."""
        return self._java_command(main_class, *args, log4j2=self.workdir / "tools-log4j2.properties",
                                  jvm_options=("-Xmx256m", "-XX:-UsePerfData"))


def _write_properties(path: Path, props: Mapping[str, str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        javaproperties.dump(props, f, timestamp=False)
