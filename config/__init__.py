"""tierproxy's configuration: one Kafka-style `.properties` file for the proxy and the
pipeline, every key declared once here with its type, default, valid values and doc.

Keys follow KIP-405 and Kafka's broker names. Per-topic settings of tiered topics use
Kafka's topic-level names under `topic.<name>.` (`topic.orders.local.retention.ms=...`);
a topic without an override takes the broker-style default (`log.local.retention.ms`).
An unknown key, a bad value or a missing required key stops start-up with a message
that names the key and what it accepts.
"""

from __future__ import annotations

import builtins
import enum
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Generic, Protocol, TypeVar, overload

from .addresses import parse_host_port
from . import broker_ports
from .broker_ports import check_host_pattern, node_id_range, port_map
from .properties import read_properties

T = TypeVar("T")
D = TypeVar("D")

MIB = 1024 * 1024
GIB = 1024 * MIB


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message names the key."""


class _Required(enum.Enum):
    # An enum member, so that `value is REQUIRED` narrows a key's default for a type checker.
    REQUIRED = "required"

    def __repr__(self) -> str:
        return "(required)"

    __str__ = __repr__


REQUIRED: Final = _Required.REQUIRED


# --- validators: each raises ValueError with what is allowed, and describes itself ---


@dataclass(frozen=True)
class Range:
    low: float | None = None
    high: float | None = None

    def __call__(self, value: Any) -> None:
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise ValueError(f"must be {self}")

    def __str__(self) -> str:
        low, high = _number(self.low), _number(self.high)
        if self.high is None:
            return f">= {low}"
        if self.low is None:
            return f"<= {high}"
        return f"in [{low}, {high}]"


def _number(value: float | None) -> str:
    return str(int(value)) if value is not None and float(value).is_integer() else str(value)


@dataclass(frozen=True)
class OneOf:
    values: tuple[Any, ...]

    def __call__(self, value: Any) -> None:
        if value not in self.values:
            raise ValueError(f"must be one of {self}")

    def __str__(self) -> str:
        return ", ".join('""' if v == "" else str(v) for v in self.values)


_KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def key_files(entries: Iterable[str]) -> dict[str, Path]:
    """`ID:FILE` entries of remote.log.storage.encryption.keys as {id: file}; ValueError names
    the entry that is wrong. Reads no file (storage.encryption does)."""
    files: dict[str, Path] = {}
    for entry in entries:
        key_id, sep, file = entry.partition(":")
        key_id, file = key_id.strip(), file.strip()
        if not sep or not file:
            raise ValueError(f"entry {entry!r} is not ID:FILE")
        if not _KEY_ID.match(key_id):
            raise ValueError(f"key id {key_id!r}: must be 1 to 64 of A-Z a-z 0-9 . _ -")
        if key_id in files:
            raise ValueError(f"key id {key_id!r} is listed twice")
        files[key_id] = Path(file).expanduser()
    return files


class KeyFiles:
    """remote.log.storage.encryption.keys: distinct ids, each with a file."""

    def __call__(self, value: tuple[str, ...]) -> None:
        key_files(value)

    def __str__(self) -> str:
        return "ID:FILE[,ID:FILE...], distinct ids of A-Z a-z 0-9 . _ -"


@dataclass(frozen=True)
class HostPorts:
    """Every item of a list is Kafka's `host:port` (or `[ipv6]:port`)."""

    def __call__(self, value: tuple[str, ...]) -> None:
        for address in value:
            parse_host_port(address)  # its ValueError names the item and what is wrong

    def __str__(self) -> str:
        return "host:port[,host:port]"


class PortMap:
    """proxy.broker.port.map: distinct node ids, each on a port of its own."""

    def __call__(self, value: tuple[str, ...]) -> None:
        port_map(value)

    def __str__(self) -> str:
        return "NODE:PORT[,NODE:PORT...], distinct node ids and ports in [1, 65535]"


class NodeIdRange:
    """proxy.broker.node.id.range: LOW-HIGH or empty."""

    def __call__(self, value: str) -> None:
        node_id_range(value)

    def __str__(self) -> str:
        return 'LOW-HIGH (node ids, LOW <= HIGH), or ""'


class HostPattern:
    """proxy.advertised.host.pattern: a host name with $(nodeId) in it, or empty."""

    def __call__(self, value: str) -> None:
        check_host_pattern(value)

    def __str__(self) -> str:
        return 'a host name containing $(nodeId), or ""'


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError("must be true or false")
    return lowered == "true"


def _parse_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


_PARSERS: dict[type, Callable[[str], Any]] = {
    int: lambda text: int(text.strip()),
    float: lambda text: float(text.strip()),
    str: lambda text: text.strip(),
    bool: _parse_bool,
    tuple: _parse_list,
    Path: lambda text: Path(text.strip()).expanduser(),
}
_TYPE_NAMES = {int: "int", float: "double", str: "string", bool: "boolean", tuple: "list", Path: "path"}
_EXPECTED = {int: "an integer", float: "a number"}


class ConfigKey(str, Generic[T]):
    """A configuration key: its name (it is that string, so it indexes any mapping of
    names) and its declaration. `Config[KEY]` is typed as the key's value type."""

    name: str
    type: builtins.type[T]
    default: T | _Required
    doc: str
    group: str
    validator: Callable[[Any], None] | None
    # Another name accepted for the same setting, with a conversion to this key's unit.
    alias: str | None
    alias_convert: Callable[[Any], Any] | None
    secret: bool

    def __new__(cls, name: str, type_: builtins.type[Any], default: Any, doc: str, group: str,
                validator: Callable[[Any], None] | None = None, *, alias: str | None = None,
                alias_convert: Callable[[Any], Any] | None = None, secret: bool = False) -> ConfigKey[Any]:
        key = super().__new__(cls, name)
        key.name, key.type, key.default, key.doc, key.group = name, type_, default, doc, group
        key.validator, key.alias, key.alias_convert, key.secret = validator, alias, alias_convert, secret
        return key

    @property
    def type_name(self) -> str:
        return _TYPE_NAMES[self.type]

    @property
    def valid_values(self) -> str:
        return str(self.validator) if self.validator is not None else ""

    def parse(self, text: str, *, as_name: str | None = None) -> T:
        name = as_name or self.name
        shown = "[hidden]" if self.secret else repr(text)
        try:
            value = _PARSERS[self.type](text)
        except ValueError as e:
            detail = f"must be {_EXPECTED[self.type]}" if self.type in _EXPECTED else str(e)
            raise ConfigError(f"{name}={shown}: {detail}") from None
        if as_name is not None and self.alias_convert is not None:
            value = self.alias_convert(value)
        if self.validator is not None:
            try:
                self.validator(value)
            except ValueError as e:
                raise ConfigError(f"{name}={shown}: {e}") from None
        return value


# --- the keys -------------------------------------------------------------------------

_KEYS: list[ConfigKey[Any]] = []
_TOPIC_KEYS: dict[str, ConfigKey[Any]] = {}


# The declared type of a list key: its values are tuples of strings (_parse_list).
LIST: type[tuple[str, ...]] = tuple


def _define(name: str, type_: type[T], default: T | _Required, doc: str, group: str, **kwargs: Any) -> ConfigKey[T]:
    key: ConfigKey[T] = ConfigKey(name, type_, default, doc, group, **kwargs)
    _KEYS.append(key)
    return key


_PREFIX_KEYS: dict[str, ConfigKey[Any]] = {}


def _define_prefix(prefix: str, doc: str, group: str) -> str:
    """Keys `<prefix><property>` passed through as strings to what they configure (Iceberg's
    catalog properties keep Iceberg's own names); `Config.prefixed(prefix)` gives them."""
    _PREFIX_KEYS[prefix] = ConfigKey(f"{prefix}<property>", str, "", doc, group)
    return prefix


def _topic_key(name: str, type_: type, doc: str, validator: Callable[[Any], None] | None = None, *,
               default: Any = None) -> None:
    """A Kafka topic-level setting, given as `topic.<name>.<key>`; without a `default` it
    falls back to a broker-style key (TOPIC_DEFAULTS)."""
    _TOPIC_KEYS[name] = ConfigKey(name, type_, default, doc, "topic", validator)


# Cluster
BOOTSTRAP_SERVERS = _define("bootstrap.servers", LIST, REQUIRED, "The Kafka cluster's bootstrap servers, host:port[,host:port].",
        "cluster", validator=HostPorts())

# Security of the connections tierproxy opens itself (the pipeline, `status`, the
# metadata topic, the proxy's own broker queries), with Kafka's client names; the
# librdkafka spellings (`ssl.ca.location`, `sasl.username`, ...) are accepted too.
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
STORE_TYPES = ("PEM", "PKCS12")
SECURITY_PROTOCOL = _define("security.protocol", str, "PLAINTEXT",
        "How tierproxy and the proxy's upstream connections reach the brokers. With SSL or SASL_SSL "
        "the proxy also speaks TLS to the brokers for its clients; SASL stays the clients' own.",
        "security", validator=OneOf(SECURITY_PROTOCOLS))
SASL_MECHANISM = _define("sasl.mechanism", str, "",
        "SASL mechanism of tierproxy's own connections (required with SASL_PLAINTEXT and SASL_SSL).",
        "security", validator=OneOf(("", *SASL_MECHANISMS)))
SASL_JAAS_CONFIG = _define("sasl.jaas.config", str, "",
        "Credentials as Kafka writes them: `org.apache.kafka.common.security.plain.PlainLoginModule "
        "required username=\"u\" password=\"p\";` (or `...scram.ScramLoginModule`); or give "
        "sasl.username and sasl.password.", "security", secret=True)
SASL_USERNAME = _define("sasl.username", str, "", "SASL user name (instead of sasl.jaas.config).", "security")
SASL_PASSWORD = _define("sasl.password", str, "", "SASL password (instead of sasl.jaas.config).", "security", secret=True)
SSL_TRUSTSTORE_LOCATION = _define("ssl.truststore.location", str, "",
        "CA certificates that verify the brokers (ssl.truststore.type); empty for the system's trust store.",
        "security")
SSL_TRUSTSTORE_TYPE = _define("ssl.truststore.type", str, "PEM", "Format of ssl.truststore.location (JKS: convert with keytool).",
        "security", validator=OneOf(STORE_TYPES))
SSL_TRUSTSTORE_PASSWORD = _define("ssl.truststore.password", str, "", "Password of a PKCS12 truststore.", "security", secret=True)
SSL_CA_LOCATION = _define("ssl.ca.location", str, "", "PEM CA certificates that verify the brokers (librdkafka's name).",
        "security")
SSL_KEYSTORE_LOCATION = _define("ssl.keystore.location", str, "",
        "Client certificate and private key for mutual TLS (ssl.keystore.type).", "security")
SSL_KEYSTORE_TYPE = _define("ssl.keystore.type", str, "PEM", "Format of ssl.keystore.location.", "security",
        validator=OneOf(STORE_TYPES))
SSL_KEYSTORE_PASSWORD = _define("ssl.keystore.password", str, "", "Password of a PKCS12 keystore.", "security", secret=True)
SSL_CERTIFICATE_LOCATION = _define("ssl.certificate.location", str, "",
        "PEM client certificate for mutual TLS (librdkafka's name; with ssl.key.location).", "security")
SSL_KEY_LOCATION = _define("ssl.key.location", str, "", "PEM private key of ssl.certificate.location.", "security")
SSL_KEY_PASSWORD = _define("ssl.key.password", str, "", "Password of the client's private key, if it is encrypted.", "security",
        secret=True)
SSL_ENDPOINT_IDENTIFICATION_ALGORITHM = _define("ssl.endpoint.identification.algorithm", str, "https",
        "`https` checks that a broker's certificate names the host connected to; empty turns the check off.",
        "security", validator=OneOf(("https", "")))

# Remote storage
REMOTE_LOG_STORAGE_BACKEND = _define("remote.log.storage.backend", str, "local",
        "Where remote segments live: `local` files (one machine) or `s3`.", "remote storage",
        validator=OneOf(("local", "s3")))
REMOTE_LOG_STORAGE_KEY_PREFIX = _define("remote.log.storage.key.prefix", str, "", "Prefix of every object key.", "remote storage")
REMOTE_LOG_STORAGE_LOCAL_DIR = _define("remote.log.storage.local.dir", Path, Path("tierproxy-data/remote"),
        "Directory of the local-file backend.", "remote storage")
REMOTE_LOG_STORAGE_S3_BUCKET = _define("remote.log.storage.s3.bucket", str, "", "S3 bucket (required with the s3 backend).", "remote storage")
REMOTE_LOG_STORAGE_S3_ENDPOINT_URL = _define("remote.log.storage.s3.endpoint.url", str, "",
        "S3 endpoint URL; empty for AWS's own endpoints.", "remote storage")
REMOTE_LOG_STORAGE_S3_SSL_TRUSTSTORE_LOCATION = _define("remote.log.storage.s3.ssl.truststore.location", str, "",
        "PEM CA certificates that verify an https endpoint.url's certificate (a private CA); empty for the "
        "system's trust store.", "remote storage")
REMOTE_LOG_STORAGE_S3_REGION = _define("remote.log.storage.s3.region", str, "us-east-1", "S3 region.", "remote storage")
REMOTE_LOG_STORAGE_S3_ACCESS_KEY_ID = _define("remote.log.storage.s3.access.key.id", str, "",
        "S3 access key id; empty to use the default AWS credential chain.", "remote storage")
REMOTE_LOG_STORAGE_S3_SECRET_ACCESS_KEY = _define("remote.log.storage.s3.secret.access.key", str, "", "S3 secret access key.", "remote storage",
        secret=True)
REMOTE_LOG_STORAGE_S3_MULTIPART_THRESHOLD_BYTES = _define("remote.log.storage.s3.multipart.threshold.bytes", int, 16 * MIB,
        "Segments larger than this are uploaded in parts.", "remote storage", validator=Range(5 * MIB))
REMOTE_LOG_STORAGE_S3_MULTIPART_PART_BYTES = _define("remote.log.storage.s3.multipart.part.bytes", int, 8 * MIB,
        "Size of one multipart part (S3's minimum is 5 MiB).", "remote storage", validator=Range(5 * MIB))
REMOTE_LOG_STORAGE_S3_MAX_CONNECTIONS = _define("remote.log.storage.s3.max.connections", int, 32, "Connection pool size to S3.", "remote storage",
        validator=Range(1))
REMOTE_LOG_STORAGE_S3_REQUEST_TIMEOUT_MS = _define("remote.log.storage.s3.request.timeout.ms", int, 30_000, "Timeout of one S3 request.",
        "remote storage", validator=Range(1))
REMOTE_LOG_STORAGE_S3_MAX_ATTEMPTS = _define("remote.log.storage.s3.max.attempts", int, 5, "Attempts of one S3 request before it fails.",
        "remote storage", validator=Range(1))
S3_SSE_MODES = ("", "AES256", "aws:kms")
REMOTE_LOG_STORAGE_S3_SSE = _define("remote.log.storage.s3.sse", str, "",
        "S3 server-side encryption asked for on every object written: AES256 (SSE-S3), aws:kms (SSE-KMS), "
        "or empty for the bucket's default.", "remote storage", validator=OneOf(S3_SSE_MODES))
REMOTE_LOG_STORAGE_S3_SSE_KMS_KEY_ID = _define("remote.log.storage.s3.sse.kms.key.id", str, "",
        "KMS key (id, ARN or alias) of remote.log.storage.s3.sse=aws:kms; empty for the AWS managed key.",
        "remote storage")

# Envelope encryption of remote segments (storage/encryption.py)
REMOTE_LOG_STORAGE_ENCRYPTION_KEYS = _define("remote.log.storage.encryption.keys", LIST, (),
        "Key-encryption keys, `ID:FILE[,ID:FILE...]`: each file holds one line, the base64 of 32 random "
        "bytes (`openssl rand -base64 32`). Each segment's manifest names the key that wraps its data key; "
        "keep a key listed while any segment uses it (`tierproxy status` tells).", "remote storage encryption",
        validator=KeyFiles())
REMOTE_LOG_STORAGE_ENCRYPTION_ACTIVE_KEY = _define("remote.log.storage.encryption.active.key", str, "",
        "Id of the key that wraps the data keys of segments copied from now on; empty copies them "
        "unencrypted (segments already encrypted stay readable with their keys).", "remote storage encryption")
REMOTE_LOG_STORAGE_ENCRYPTION_REQUIRED = _define("remote.log.storage.encryption.required", bool, False,
        "Refuse to read a segment stored unencrypted (its manifest says so), as if it were corrupt: set it "
        "once every segment is encrypted (`tierproxy status` tells), so that a manifest replaced by one "
        "without encryption serves nothing. Needs remote.log.storage.encryption.active.key, unless the "
        "proxy only serves read replicas (it writes no segment).",
        "remote storage encryption")

# Remote log metadata
REMOTE_LOG_METADATA_BACKEND = _define("remote.log.metadata.backend", str, "file",
        "Where segment metadata lives: a local `file` (one machine) or the `topic` __remote_log_metadata; "
        "or, read-only, `remote`: what the tiering pipeline publishes into the remote store "
        "(`<prefix>/__remote_log_metadata/`) after each pass, for a proxy with only the store's "
        "credentials (a read replica) or a fast first start.",
        "remote log metadata", validator=OneOf(("file", "topic", "remote")))
REMOTE_LOG_METADATA_DIR = _define("remote.log.metadata.dir", Path, Path("tierproxy-data/metadata"),
        "Directory of the file backend, and of the topic backend's materialized flat files.",
        "remote log metadata")
REMOTE_LOG_REPLICA_REFRESH_INTERVAL_MS = _define("remote.log.replica.refresh.interval.ms", int, 5_000,
        "With remote.log.metadata.backend=remote, how often the metadata published into the remote store "
        "is read again (one GET of its head when nothing changed): new remote segments are served at "
        "most this much later.", "remote log metadata", validator=Range(1))
REMOTE_LOG_METADATA_TOPIC_NUM_PARTITIONS = _define("remote.log.metadata.topic.num.partitions", int, 50,
        "Partitions of __remote_log_metadata when it is created.", "remote log metadata", validator=Range(1))
REMOTE_LOG_METADATA_TOPIC_REPLICATION_FACTOR = _define("remote.log.metadata.topic.replication.factor", int, -1,
        "Replication of __remote_log_metadata when it is created; -1 for min(3, brokers).",
        "remote log metadata", validator=Range(-1, 32767))

# Remote log manager (the pipeline's loop)
REMOTE_LOG_MANAGER_TASK_INTERVAL_MS = _define("remote.log.manager.task.interval.ms", int, 30_000,
        "Interval between tiering passes of `tierproxy tier --every`.", "remote log manager",
        validator=Range(1))
REMOTE_LOG_MANAGER_TASK_RETRY_BACKOFF_MS = _define("remote.log.manager.task.retry.backoff.ms", int, 500, "First retry backoff of a remote operation.",
        "remote log manager", validator=Range(0))
REMOTE_LOG_MANAGER_TASK_RETRY_BACKOFF_MAX_MS = _define("remote.log.manager.task.retry.backoff.max.ms", int, 30_000, "Largest retry backoff.",
        "remote log manager", validator=Range(0))
REMOTE_LOG_MANAGER_TASK_RETRY_JITTER = _define("remote.log.manager.task.retry.jitter", float, 0.2, "Random jitter of a retry backoff.",
        "remote log manager", validator=Range(0, 1))
REMOTE_PARTITION_REMOVER_TASK_INTERVAL_MS = _define("remote.partition.remover.task.interval.ms", int, 3_600_000,
        "Interval between checks for deleted topics whose remote data must be removed.",
        "remote log manager", validator=Range(1))
# KIP-956's quotas: Kafka's names, defaults and semantics (storage.quota).
UNLIMITED_BYTES_PER_SECOND = 2**63 - 1  # Kafka's Long.MAX_VALUE: no quota
REMOTE_LOG_MANAGER_COPY_MAX_BYTES_PER_SECOND = _define("remote.log.manager.copy.max.bytes.per.second", int,
        UNLIMITED_BYTES_PER_SECOND,
        "Bytes per second the pipeline copies to remote storage, all copy tasks of a pass together (KIP-956); "
        "each of the Spark tasks running at once gets an equal share. A copy over the quota waits, it never "
        "fails. The default, Long.MAX_VALUE, is no quota.", "remote log manager", validator=Range(1))
REMOTE_LOG_MANAGER_COPY_QUOTA_WINDOW_NUM = _define("remote.log.manager.copy.quota.window.num", int, 11,
        "Samples of the copy rate kept (10 whole windows and the current one by default).", "remote log manager",
        validator=Range(1))
REMOTE_LOG_MANAGER_COPY_QUOTA_WINDOW_SIZE_SECONDS = _define("remote.log.manager.copy.quota.window.size.seconds", int, 1,
        "Time span of one sample of the copy rate.", "remote log manager", validator=Range(1))
REMOTE_LOG_MANAGER_FETCH_MAX_BYTES_PER_SECOND = _define("remote.log.manager.fetch.max.bytes.per.second", int,
        UNLIMITED_BYTES_PER_SECOND,
        "Bytes per second the proxy reads from remote storage for Fetches (read-ahead included), all "
        "workers together (KIP-956's fetch quota): while it has no room for a Fetch's reads, the "
        "Fetch's remote partitions get empty records, no error, and the others are served; "
        "connections held back read in turn. The default, Long.MAX_VALUE, is no quota.",
        "remote log manager", validator=Range(1))
REMOTE_LOG_MANAGER_FETCH_QUOTA_WINDOW_NUM = _define("remote.log.manager.fetch.quota.window.num", int, 11,
        "Samples of the remote fetch rate kept.", "remote log manager", validator=Range(1))
REMOTE_LOG_MANAGER_FETCH_QUOTA_WINDOW_SIZE_SECONDS = _define("remote.log.manager.fetch.quota.window.size.seconds", int, 1,
        "Time span of one sample of the remote fetch rate.", "remote log manager", validator=Range(1))
LOG_INDEX_INTERVAL_BYTES = _define("log.index.interval.bytes", int, 4096, "Bytes of log between two offset-index entries.",
        "remote log manager", validator=Range(0))

# Defaults of tiered topics (Kafka's broker names; `topic.<name>.<key>` overrides)
LOG_LOCAL_RETENTION_MS = _define("log.local.retention.ms", int, -2,
        "Local retention of tiered topics; -2 means retention.ms.", "topic defaults", validator=Range(-2))
LOG_LOCAL_RETENTION_BYTES = _define("log.local.retention.bytes", int, -2,
        "Local retention bytes of tiered topics; -2 means retention.bytes.", "topic defaults",
        validator=Range(-2))
LOG_RETENTION_MS = _define("log.retention.ms", int, 604_800_000, "Remote retention of tiered topics; -1 keeps forever.",
        "topic defaults", validator=Range(-1))
LOG_RETENTION_BYTES = _define("log.retention.bytes", int, -1, "Remote retention bytes per partition; -1 for no limit.",
        "topic defaults", validator=Range(-1))
LOG_SEGMENT_BYTES = _define("log.segment.bytes", int, GIB, "Size of a remote segment cut by the pipeline.", "topic defaults",
        validator=Range(1))
LOG_ROLL_MS = _define("log.roll.ms", int, 604_800_000,
        "A remote segment is also cut when its first batch is older than this.", "topic defaults",
        validator=Range(1))

_topic_key("remote.storage.enable", bool, "Tier this topic. Turning it off while the topic has remote data needs "
           "remote.log.delete.on.disable=true (Kafka's rule): the pipeline then deletes the remote data.",
           default=False)
_topic_key("remote.log.copy.disable", bool, "Stop copying this tiered topic (KIP-950): its remote data is still "
           "served and expires by retention.ms / retention.bytes, which local.retention.ms / .bytes must then "
           "equal (or be -2), as Kafka requires.", default=False)
_topic_key("remote.log.delete.on.disable", bool, "With remote.storage.enable=false: delete the topic's remote "
           "data and its metadata at the next pass (KIP-950), after which nothing of it is served remotely.",
           default=False)
_topic_key("remote.log.read.replica", bool, "Serve this topic from the remote tier only, as a read replica of the "
           "cluster that tiered it: the topic on this cluster is empty (`tierproxy replica create`), Fetch and "
           "ListOffsets are answered from the remote log, Produce is refused. Not with remote.storage.enable.",
           default=False)
_topic_key("local.retention.ms", int, "Local retention; -2 means retention.ms.", Range(-2))
_topic_key("local.retention.bytes", int, "Local retention bytes; -2 means retention.bytes.", Range(-2))
_topic_key("retention.ms", int, "Remote retention; -1 keeps forever.", Range(-1))
_topic_key("retention.bytes", int, "Remote retention bytes; -1 for no limit.", Range(-1))
_topic_key("segment.bytes", int, "Size of a remote segment.", Range(1))
_topic_key("segment.ms", int, "Age at which a remote segment is cut.", Range(1))
ICEBERG_PARTITION_SPECS = ("day", "hour", "partition", "partition,day", "partition,hour", "none")
_topic_key("iceberg.enable", bool, "Keep an Iceberg table of this tiered topic (`<iceberg.namespace>.<topic>`): "
           "after each tiering pass the records of the newly copied remote segments are appended to it, read "
           "from the remote segments (never the broker) as a read_committed consumer sees them; the first "
           "pass backfills every remote segment.", default=False)
_topic_key("iceberg.partition.spec", str, "How the topic's Iceberg table is partitioned: by `day` or `hour` of "
           "the record timestamp, by Kafka `partition` (identity), both, or `none`. Read when the table is "
           "created.", OneOf(ICEBERG_PARTITION_SPECS), default="day")
_topic_key("iceberg.retention.ms", int, "Rows of the Iceberg table older than this (by record timestamp) are "
           "deleted by `tierproxy iceberg maintain`; -1 keeps them however remote retention expires segments.",
           Range(-1), default=-1)

# Typed columns of the topic's Iceberg table (pipeline/iceberg/formats.py)
ICEBERG_FORMATS = ("raw", "json", "avro")
for _side in ("key", "value"):
    _topic_key(f"iceberg.{_side}.format", str, f"How the Iceberg table decodes the record {_side}s into typed "
               f"columns: `raw` keeps only the bytes; `json` checks them against the JSON Schema of "
               f"iceberg.{_side}.schema.file; `avro` reads them with the Avro schema of iceberg.{_side}.schema.file, "
               f"or, with iceberg.schema.registry.url, in the Schema Registry wire format (magic byte 0, 4-byte "
               f"schema id). A {_side} that does not decode goes whole, with the reason, to the table "
               f"`<topic>__dlq`; a null {_side} is kept, with null columns.",
               OneOf(ICEBERG_FORMATS), default="raw")
    _topic_key(f"iceberg.{_side}.schema.file", str, f"The JSON Schema (format json) or Avro schema (format avro) "
               f"file of the record {_side}s: the table's columns. With a schema registry and no file, the "
               f"newest schema of the subject `<topic>-{_side}`.", default="")
del _side

# Topic-level name -> the default key it falls back to.
TOPIC_DEFAULTS = {
    "local.retention.ms": "log.local.retention.ms",
    "local.retention.bytes": "log.local.retention.bytes",
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
}

# Iceberg tables of tiered topics: decoding
ICEBERG_SCHEMA_REGISTRY_URL = _define("iceberg.schema.registry.url", str, "",
        "A Confluent-compatible schema registry (Confluent, Apicurio's ccompat API, Karapace): with it, "
        "`topic.<name>.iceberg.{key,value}.format=avro` (or json) records are in the wire format, each read "
        "with the schema of its id. Empty: none.", "iceberg")

# Pipeline
SPARK_MASTER = _define("spark.master", str, "local[*]", "Spark master of the tiering pipeline (local[*], spark://, yarn, k8s://).",
        "pipeline")
SPARK_APP_NAME = _define("spark.app.name", str, "tierproxy-tier", "Spark application name.", "pipeline")
PIPELINE_FETCH_MAX_BYTES = _define("pipeline.fetch.max.bytes", int, 8 * MIB,
        "Bytes asked for in one Fetch when a copy task reads a partition from its leader.", "pipeline",
        validator=Range(64 * 1024))
PIPELINE_METRICS_PORT = _define("pipeline.metrics.port", int, 9405,
        "Port of the Prometheus metrics endpoint of `tierproxy tier --every` (on proxy.listener.host), apart "
        "from metrics.port so that `serve` and the pipeline run from one file on one machine; 0 disables it. "
        "docs/metrics.md lists the metrics.", "pipeline", validator=Range(0, 65535))
# Iceberg tables of tiered topics (pipeline/iceberg)
ICEBERG_NAMESPACE = _define("iceberg.namespace", str, "kafka",
        "Iceberg namespace of the topics' tables (`topic.<name>.iceberg.enable`); created when missing.", "iceberg",
        validator=None)
ICEBERG_CATALOG_PREFIX = _define_prefix("iceberg.catalog.",
        "The Iceberg catalog's own properties, under the names Iceberg gives them (`iceberg.catalog.type=rest`, "
        "`iceberg.catalog.uri=https://...`, `iceberg.catalog.warehouse`, `iceberg.catalog.s3.endpoint`, "
        "`iceberg.catalog.credential`, ...). None given: a SQL catalog in the SQLite file "
        "`<remote.log.metadata.dir>/iceberg/catalog.db` with the warehouse in the tier's own store "
        "(`<remote.log.storage.local.dir>/iceberg`, or `s3://<bucket>/<remote.log.storage.key.prefix>/iceberg` "
        "with the store's endpoint and credentials).", "iceberg")
ICEBERG_TARGET_FILE_SIZE_BYTES = _define("iceberg.write.target.file.size.bytes", int, 64 * MIB,
        "Arrow bytes of records a Spark task gathers before it writes them as one Parquet data file: what "
        "bounds a task's memory, whatever the size of the segment it reads.", "iceberg", validator=Range(MIB))
ICEBERG_SNAPSHOT_MAX_AGE_MS = _define("iceberg.snapshot.max.age.ms", int, 5 * 24 * 3_600_000,
        "`tierproxy iceberg maintain` expires snapshots older than this (the newest one always stays).", "iceberg",
        validator=Range(0))

PIPELINE_TEST_FAIL_AFTER_OBJECTS = _define("pipeline.test.fail.after.objects", int, 0,
        "Test hook: the first attempt of a copy task fails after uploading this many objects "
        "(0, the default, turns it off). Only for fault-injection tests.", "pipeline", validator=Range(0))

# Proxy
PROXY_LISTENER_HOST = _define("proxy.listener.host", str, "127.0.0.1", "Address the proxy listens on.", "proxy")
PROXY_ADVERTISED_HOST = _define("proxy.advertised.host", str, "",
        "Host the proxy advertises to clients; empty for proxy.listener.host.", "proxy")
PROXY_ADVERTISED_HOST_PATTERN = _define("proxy.advertised.host.pattern", str, "",
        "Host advertised for each broker node, `$(nodeId)` standing for its node id (e.g. "
        "`broker-$(nodeId).kafka.example.com`), so that each broker has a DNS and TLS name of its own; "
        "empty for proxy.advertised.host.", "proxy", validator=HostPattern())
PROXY_BOOTSTRAP_PORT = _define("proxy.bootstrap.port", int, 9192, "Port of the proxy's bootstrap listener.", "proxy",
        validator=Range(0, 65535))
PROXY_BROKER_PORT_BASE = _define("proxy.broker.port.base", int, 9193,
        "Without proxy.broker.port.map or proxy.broker.node.id.range, the listener of broker node N is this "
        "port + N.", "proxy", validator=Range(0, 65535))
PROXY_BROKER_PORT_MAP = _define("proxy.broker.port.map", LIST, (),
        "The listener port of each broker node, `NODE:PORT[,NODE:PORT...]` (e.g. `1001:9194,1002:9195`). "
        "A node not listed gets no listener: clients are not told about it (see docs/operations.md).",
        "proxy", validator=PortMap())
PROXY_BROKER_NODE_ID_RANGE = _define("proxy.broker.node.id.range", str, "",
        "Broker node ids `LOW-HIGH` (e.g. `1000-1099`) with listeners from proxy.broker.port.start on: "
        "node n listens on proxy.broker.port.start + n - LOW. A node outside gets no listener.", "proxy",
        validator=NodeIdRange())
PROXY_BROKER_PORT_START = _define("proxy.broker.port.start", int, 0,
        "The listener port of the first node id of proxy.broker.node.id.range (required with it).", "proxy",
        validator=Range(0, 65535))
PROXY_WORKERS = _define("proxy.workers", int, 0,
        "Worker processes serving the proxy's listeners together (SO_REUSEPORT); 0 for one per CPU "
        "core. Each worker gets its share of the cache bounds, reader threads and connection limits, "
        "so the totals hold for the whole proxy; a worker that dies is restarted.", "proxy",
        validator=Range(0, 256))
PROXY_LISTENER_SHARED = _define("proxy.listener.shared", bool, False,
        "Let another `tierproxy serve` join this one's listeners (SO_REUSEPORT, with proxy.workers above 1 "
        "in both), the kernel spreading connections among them, e.g. to hand over to a new proxy on the same "
        "host. By default a serve claims its ports like a broker, and a second one on them refuses to start.",
        "proxy")
SOCKET_REQUEST_MAX_BYTES = _define("socket.request.max.bytes", int, 104_857_600, "Largest frame a client may send.", "proxy",
        validator=Range(1))
MAX_PENDING_RESPONSE_BYTES_PER_CONNECTION = _define("max.pending.response.bytes.per.connection", int, MIB,
        "Response bytes a client has not read yet above which the proxy stops reading its requests "
        "(and its broker's responses) until they drained.", "connection limits", validator=Range(1024))
SOCKET_SEND_BUFFER_BYTES = _define("socket.send.buffer.bytes", int, -1,
        "The SO_SNDBUF of client connections (Kafka's broker config; the kernel doubles it); -1, the "
        "default here, leaves it to the kernel's autotuning, which grows it to net.ipv4.tcp_wmem's maximum "
        "(4 MiB on most Linux) for a client that reads fast or not at all. A bound (Kafka's default is "
        "102400) caps that kernel memory per client, counted by a container's memory limit, not the proxy's "
        "RSS, at the cost of responses waiting in the chunk cache instead (see docs/operations.md, Memory).",
        "connection limits", validator=Range(-1))
MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION = _define("max.in.flight.requests.per.connection", int, 100,
        "Requests read from one client and not answered yet; at the limit the proxy stops reading "
        "that client until a response went out.", "connection limits", validator=Range(1))
SASL_SERVER_MAX_RECEIVE_SIZE = _define("sasl.server.max.receive.size", int, 524_288,
        "Largest frame before SASL authentication completed, whenever the brokers' listener may want SASL "
        "(security.protocol SASL_*, or learned from the brokers).",
        "connection limits", validator=Range(1))
CONNECTIONS_MAX_IDLE_MS = _define("connections.max.idle.ms", int, 600_000,
        "A client connection with nothing received, sent or owed for this long is closed.",
        "connection limits", validator=Range(1))
REQUEST_RECEIVE_TIMEOUT_MS = _define("request.receive.timeout.ms", int, 30_000,
        "A request frame begun but not complete after this long closes the connection "
        "(a client gives up on a request after its request.timeout.ms, 30 s by default).",
        "connection limits", validator=Range(1))
MAX_CONNECTIONS = _define("max.connections", int, 2**31 - 1,
        "Client connections the proxy accepts at once, all listeners together; over it a new "
        "connection is closed at once.", "connection limits", validator=Range(0))
MAX_CONNECTIONS_PER_IP = _define("max.connections.per.ip", int, 2**31 - 1,
        "Client connections from one IP address at once; over it a new connection is closed at once.",
        "connection limits", validator=Range(0))
MAX_CONNECTION_CREATION_RATE = _define("max.connection.creation.rate", int, 2**31 - 1,
        "New client connections per second the proxy takes on, all listeners together (Kafka's "
        "KIP-612 broker config). A connection over the rate waits, unread, until the rate allows "
        "it, as Kafka's acceptor delays accepting it; connections already open are not slowed. "
        "Bursts of up to one second's worth pass at once; each of proxy.workers takes its share. "
        "The default, Int.MaxValue, is no bound.",
        "connection limits", validator=Range(1))
REMOTE_LOG_INDEX_FILE_CACHE_TOTAL_SIZE_BYTES = _define("remote.log.index.file.cache.total.size.bytes", int, GIB,
        "Bytes of remote indexes cached in memory (Kafka's name; the KIP's `.size.mb` is accepted too).",
        "proxy", validator=Range(0), alias="remote.log.index.file.cache.total.size.mb",
        alias_convert=lambda mb: mb * MIB)
REMOTE_LOG_INDEX_CACHE_DIR = _define("remote.log.index.cache.dir", str, "",
        "Directory where fetched indexes are also kept, reloaded at start-up; empty for memory only.", "proxy")
REMOTE_LOG_CHUNK_CACHE_SIZE_BYTES = _define("remote.log.chunk.cache.size.bytes", int, 256 * MIB, "Bytes of remote segment data cached.", "proxy",
        validator=Range(0))
REMOTE_LOG_CHUNK_SIZE_BYTES = _define("remote.log.chunk.size.bytes", int, 4 * MIB, "Size of one ranged read from a remote segment.",
        "proxy", validator=Range(4096))
REMOTE_LOG_READ_AHEAD_CHUNKS = _define("remote.log.read.ahead.chunks", int, 2,
        "Fewest chunks prefetched after a sequential read, carrying on into the next segment near a segment's "
        "end. More are kept in flight where the store's observed first-byte latency needs them: "
        "ceil(latency / chunk transfer time) + 1, up to remote.log.read.ahead.max.chunks; 0 turns read-ahead off.",
        "proxy", validator=Range(0))
REMOTE_LOG_READ_AHEAD_MAX_CHUNKS = _define("remote.log.read.ahead.max.chunks", int, 8,
        "Most chunks prefetched ahead of one sequential reader (ranged reads in flight for one segment), "
        "however long the store takes to answer; the chunk cache's size bounds them too.",
        "proxy", validator=Range(1))
REMOTE_LOG_READER_THREADS = _define("remote.log.reader.threads", int, 10, "Remote reads running at once.", "proxy", validator=Range(1))
REMOTE_LOG_READER_MAX_PENDING_TASKS = _define("remote.log.reader.max.pending.tasks", int, 100,
        "Remote reads waiting for a reader; beyond that a partition gets an immediate error.", "proxy",
        validator=Range(1))
REMOTE_FETCH_MAX_WAIT_MS = _define("remote.fetch.max.wait.ms", int, 500,
        "How long a fetch waits for remote data before returning empty records for it.", "proxy",
        validator=Range(1))
REMOTE_LIST_OFFSETS_REQUEST_TIMEOUT_MS = _define("remote.list.offsets.request.timeout.ms", int, 30_000,
        "How long a ListOffsets lookup by timestamp in the remote tier may take before the partition is "
        "answered REQUEST_TIMED_OUT (Kafka's KIP-1075).", "proxy", validator=Range(1))
REMOTE_FETCH_MAX_BYTES = _define("remote.fetch.max.bytes", int, 8 * MIB,
        "Most bytes of remote records in one Fetch response (the first partition with data always "
        "gets one whole batch). Kafka's own tiered storage serves one partition per Fetch.", "proxy",
        validator=Range(1))
TIERED_STORAGE_NOT_AVAILABLE_ERROR_CODE = _define("tiered.storage.not.available.error.code", int, -1,
        "Kafka error code sent when remote data cannot be read (UNKNOWN_SERVER_ERROR -1, "
        "REPLICA_NOT_AVAILABLE 9, REQUEST_TIMED_OUT 7, KAFKA_STORAGE_ERROR 56).", "proxy",
        validator=OneOf((-1, 9, 7, 56)))
METRICS_PORT = _define("metrics.port", int, 9404,
        "Port of the Prometheus metrics endpoint of `tierproxy serve` (on proxy.listener.host), whose `/ready` "
        "answers 200 while the proxy serves and a broker answers, else 503 and why; 0 disables both. "
        "docs/metrics.md lists the metrics.", "proxy", validator=Range(0, 65535))
BROKER_CONNECTION_SETUP_TIMEOUT_MS = _define("broker.connection.setup.timeout.ms", int, 10_000,
        "How long the proxy waits for a client's upstream connection to a broker.", "proxy",
        validator=Range(1))
PROXY_SSL_CERTIFICATE_LOCATION = _define("proxy.ssl.certificate.location", str, "",
        "PEM certificate (chain) of the proxy's listeners; empty for plaintext listeners.", "proxy")
PROXY_SSL_KEY_LOCATION = _define("proxy.ssl.key.location", str, "",
        "PEM private key of proxy.ssl.certificate.location; empty if the certificate file holds it.", "proxy")
PROXY_SSL_KEY_PASSWORD = _define("proxy.ssl.key.password", str, "", "Password of the private key, if encrypted.", "proxy",
        secret=True)

KEYS: Mapping[str, ConfigKey[Any]] = {key.name: key for key in _KEYS}
TOPIC_KEYS: Mapping[str, ConfigKey[Any]] = _TOPIC_KEYS
#: prefix -> its declaration, named `<prefix><property>`
PREFIX_KEYS: Mapping[str, ConfigKey[Any]] = _PREFIX_KEYS
_ALIASES = {key.alias: key for key in _KEYS if key.alias}
_TOPIC_PREFIX = "topic."


@dataclass(frozen=True)
class TopicConfig:
    """The effective settings of one topic named in the file."""

    name: str
    remote_storage_enable: bool
    remote_log_copy_disable: bool
    remote_log_delete_on_disable: bool
    remote_log_read_replica: bool
    local_retention_ms: int
    local_retention_bytes: int
    retention_ms: int
    retention_bytes: int
    segment_bytes: int
    segment_ms: int
    iceberg_enable: bool = False
    iceberg_partition_spec: str = "day"
    iceberg_retention_ms: int = -1
    iceberg_key_format: str = "raw"
    iceberg_value_format: str = "raw"
    iceberg_key_schema_file: str = ""
    iceberg_value_schema_file: str = ""


class Settings(Protocol):
    """What reads settings: a `Config`, or a mapping of key names to parsed values (such as
    `Config.values`). Indexed with a `ConfigKey[T]`, a `Config` gives a T."""

    @overload
    def __getitem__(self, name: ConfigKey[T], /) -> T: ...

    @overload
    def __getitem__(self, name: str, /) -> Any: ...


@dataclass(frozen=True)
class Config:
    values: Mapping[str, Any]
    topics: Mapping[str, TopicConfig] = field(default_factory=dict)
    source: str = "<defaults>"
    # The names the file and its overrides set: how it was written, not what it says.
    given: frozenset[str] = field(default=frozenset(), compare=False)

    @overload
    def __getitem__(self, name: ConfigKey[T]) -> T: ...

    @overload
    def __getitem__(self, name: str) -> Any: ...

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @overload
    def get(self, name: ConfigKey[T]) -> T | None: ...

    @overload
    def get(self, name: ConfigKey[T], default: D) -> T | D: ...

    @overload
    def get(self, name: str, default: Any = None) -> Any: ...

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    @property
    def tiered_topics(self) -> list[TopicConfig]:
        return [t for t in self.topics.values() if t.remote_storage_enable]

    @property
    def read_replica_topics(self) -> list[TopicConfig]:
        """Topics this cluster serves from another cluster's remote tier only."""
        return [t for t in self.topics.values() if t.remote_log_read_replica]

    def topic(self, name: str) -> TopicConfig:
        """Settings of any topic: its overrides, else the defaults (not tiered)."""
        return self.topics.get(name) or _topic_config(name, {}, self.values)

    def prefixed(self, prefix: str) -> dict[str, str]:
        """The pass-through keys under `prefix` (one of PREFIX_KEYS), without it."""
        return {name[len(prefix):]: value for name, value in self.values.items() if name.startswith(prefix)}

    def with_overrides(self, overrides: Mapping[str, str]) -> Config:
        return parse({**self.raw(), **overrides}, source=self.source)

    def raw(self) -> dict[str, str]:
        """Back to properties text values (round trip of `parse`)."""
        out = {name: _format(value) for name, value in self.values.items() if value is not REQUIRED}
        for topic in self.topics.values():
            for key in TOPIC_KEYS:
                out[f"{_TOPIC_PREFIX}{topic.name}.{key}"] = _format(getattr(topic, key.replace(".", "_")))
        return out


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def _topic_config(name: str, overrides: Mapping[str, Any], values: Mapping[str, Any]) -> TopicConfig:
    settings = {key.replace(".", "_"): overrides.get(key, TOPIC_KEYS[key].default)
                for key in TOPIC_KEYS if key not in TOPIC_DEFAULTS}
    for key, default_key in TOPIC_DEFAULTS.items():
        settings[key.replace(".", "_")] = overrides.get(key, values[default_key])
    _check_copy_disable(name, settings)
    _check_iceberg_formats(name, settings, values)
    if settings["remote_storage_enable"] and settings["remote_log_read_replica"]:
        raise ConfigError(f"{_TOPIC_PREFIX}{name}.remote.log.read.replica=true: a read replica serves another "
                          f"cluster's remote log; it is not tiered itself (remove remote.storage.enable=true)")
    # Kafka's -2: local retention follows the (remote) retention.
    if settings["local_retention_ms"] == -2:
        settings["local_retention_ms"] = settings["retention_ms"]
    if settings["local_retention_bytes"] == -2:
        settings["local_retention_bytes"] = settings["retention_bytes"]
    return TopicConfig(name=name, **settings)


def _check_copy_disable(name: str, settings: Mapping[str, Any]) -> None:
    """Kafka's `LogConfig.validateRetentionConfigsWhenRemoteCopyDisabled`, with its messages:
    once nothing more is copied, local retention is the whole retention (-2 says so)."""
    if not (settings["remote_storage_enable"] and settings["remote_log_copy_disable"]):
        return
    for unit in ("bytes", "ms"):
        local, total = settings[f"local_retention_{unit}"], settings[f"retention_{unit}"]
        if local != -2 and local != total:
            raise ConfigError(
                f"{_TOPIC_PREFIX}{name}.remote.log.copy.disable=true: When `remote.log.copy.disable` is set to true, "
                f"the `local.retention.{unit}` and `retention.{unit}` must be set to the identical value because "
                "there will be no more logs copied to the remote storage.")


def _check_iceberg_formats(name: str, settings: Mapping[str, Any], values: Mapping[str, Any]) -> None:
    """A typed format needs its schema: a file, or for Avro a schema registry."""
    for side in ("key", "value"):
        fmt, schema_file = settings[f"iceberg_{side}_format"], settings[f"iceberg_{side}_schema_file"]
        if fmt == "json" and not schema_file:
            raise ConfigError(f"{_TOPIC_PREFIX}{name}.iceberg.{side}.format=json needs "
                              f"{_TOPIC_PREFIX}{name}.iceberg.{side}.schema.file (a JSON Schema)")
        if fmt == "avro" and not schema_file and not values["iceberg.schema.registry.url"]:
            raise ConfigError(f"{_TOPIC_PREFIX}{name}.iceberg.{side}.format=avro needs "
                              f"{_TOPIC_PREFIX}{name}.iceberg.{side}.schema.file (an Avro schema) or "
                              "iceberg.schema.registry.url")


_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def _split_topic_key(name: str) -> tuple[str, str] | None:
    """`topic.<topic>.<key>` -> (topic, key), matching the known key suffixes (topic
    names may contain dots)."""
    rest = name[len(_TOPIC_PREFIX):]
    for key in sorted(TOPIC_KEYS, key=len, reverse=True):
        if rest.endswith("." + key):
            topic = rest[: -len(key) - 1]
            if _TOPIC_NAME.match(topic):
                return topic, key
    return None


def parse(properties: Mapping[str, str], *, source: str = "<properties>") -> Config:
    values: dict[str, Any] = {}
    topic_overrides: dict[str, dict[str, Any]] = {}
    for name, text in properties.items():
        if name in KEYS:
            values[name] = KEYS[name].parse(text)
        elif name in _ALIASES:
            key = _ALIASES[name]
            if key.name in properties:
                raise ConfigError(f"{name} and {key.name} set the same thing; give only one")
            values[key.name] = key.parse(text, as_name=name)
        elif any(name.startswith(prefix) and len(name) > len(prefix) for prefix in PREFIX_KEYS):
            values[name] = text
        elif name.startswith(_TOPIC_PREFIX) and (split := _split_topic_key(name)):
            topic, setting = split
            topic_overrides.setdefault(topic, {})[setting] = TOPIC_KEYS[setting].parse(text, as_name=name)
        else:
            raise ConfigError(f"{name}: unknown configuration key{_suggest(name)}")
    for key in _KEYS:
        if key.name not in values:
            if key.default is REQUIRED:
                raise ConfigError(f"{key.name} is required: {key.doc}")
            values[key.name] = key.default
    if values["remote.log.storage.backend"] == "s3" and not values["remote.log.storage.s3.bucket"]:
        raise ConfigError("remote.log.storage.s3.bucket is required when remote.log.storage.backend=s3")
    if values["remote.log.storage.s3.multipart.part.bytes"] > values["remote.log.storage.s3.multipart.threshold.bytes"]:
        raise ConfigError("remote.log.storage.s3.multipart.part.bytes must not exceed "
                          "remote.log.storage.s3.multipart.threshold.bytes")
    if values["remote.log.manager.task.retry.backoff.max.ms"] < values["remote.log.manager.task.retry.backoff.ms"]:
        raise ConfigError("remote.log.manager.task.retry.backoff.max.ms must be >= "
                          "remote.log.manager.task.retry.backoff.ms")
    _check_security(values)
    try:
        broker_ports.check(values)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    topics = {name: _topic_config(name, overrides, values) for name, overrides in topic_overrides.items()}
    _check_encryption(values, topics)
    return Config(values=values, topics=topics, source=source, given=frozenset(properties))


def moved_key_warnings(config: Config) -> list[str]:
    """Keys set for what now has a key of its own: the pipeline's metrics endpoint was on
    metrics.port before pipeline.metrics.port. Still valid (it is `serve`'s port), so a
    warning naming where the setting went, as Kafka logs for a renamed config."""
    if METRICS_PORT.name not in config.given or PIPELINE_METRICS_PORT.name in config.given:
        return []
    port = config[PIPELINE_METRICS_PORT]
    return [f"{METRICS_PORT.name}={config[METRICS_PORT]} is the metrics port of `tierproxy serve` only; "
            f"`tierproxy tier --every` serves its metrics on {PIPELINE_METRICS_PORT.name}"
            f"{f' ({port}, its default)' if port else ''}: set {PIPELINE_METRICS_PORT.name} to move it "
            "(0 turns the pipeline's endpoint off)"]


def _check_encryption(values: Mapping[str, Any], topics: Mapping[str, TopicConfig]) -> None:
    active = values["remote.log.storage.encryption.active.key"]
    ids = list(key_files(values["remote.log.storage.encryption.keys"]))
    if active and active not in ids:
        listed = ", ".join(ids) if ids else "no key"
        raise ConfigError(f"remote.log.storage.encryption.active.key={active}: not a key of "
                          f"remote.log.storage.encryption.keys (it lists {listed})")
    # A proxy that serves read replicas and tiers nothing writes no segment: no active key.
    reads_only = any(t.remote_log_read_replica for t in topics.values()) and not any(
        t.remote_storage_enable for t in topics.values())
    if values["remote.log.storage.encryption.required"] and not active and not reads_only:
        raise ConfigError("remote.log.storage.encryption.required=true needs "
                          "remote.log.storage.encryption.active.key: new segments would be refused when read")
    if values["remote.log.storage.s3.sse.kms.key.id"] and values["remote.log.storage.s3.sse"] != "aws:kms":
        raise ConfigError("remote.log.storage.s3.sse.kms.key.id needs remote.log.storage.s3.sse=aws:kms")


def _check_security(values: Mapping[str, Any]) -> None:
    """What can be told from the values alone; the files are read by client.security."""
    protocol = values["security.protocol"]
    for one, other in (("ssl.truststore.location", "ssl.ca.location"),
                       ("ssl.keystore.location", "ssl.certificate.location")):
        if values[one] and values[other]:
            raise ConfigError(f"{one} and {other} set the same thing; give only one")
    if bool(values["ssl.certificate.location"]) != bool(values["ssl.key.location"]):
        raise ConfigError("ssl.certificate.location and ssl.key.location go together (PEM certificate and key)")
    if not protocol.startswith("SASL_"):
        return
    if not values["sasl.mechanism"]:
        raise ConfigError(f"sasl.mechanism is required with security.protocol={protocol}: one of "
                          + ", ".join(SASL_MECHANISMS))
    if values["sasl.jaas.config"] and (values["sasl.username"] or values["sasl.password"]):
        raise ConfigError("sasl.jaas.config and sasl.username/sasl.password set the same thing; give only one")
    if not values["sasl.jaas.config"] and not values["sasl.username"]:
        raise ConfigError(f"security.protocol={protocol} needs credentials: sasl.jaas.config, or "
                          "sasl.username and sasl.password")


def _suggest(name: str) -> str:
    import difflib

    candidates = [*KEYS, *_ALIASES]
    if name.startswith(_TOPIC_PREFIX):
        # A misspelt topic-level key: `topic.<topic>.<key>` for each way of reading the
        # topic's name out of it (topic names may contain dots).
        parts = name[len(_TOPIC_PREFIX):].split(".")
        candidates = [f"{_TOPIC_PREFIX}{'.'.join(parts[:i])}.{key}" for i in range(1, len(parts)) for key in TOPIC_KEYS]
    close = difflib.get_close_matches(name, candidates, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """`key=value` strings from the command line."""
    overrides = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"override {item!r} is not key=value")
        overrides[name.strip()] = value
    return overrides


def load(path: str | os.PathLike[str] | None, overrides: Iterable[str] = ()) -> Config:
    """The file (Kafka `.properties` syntax) with `key=value` overrides on top."""
    properties = read_properties(path) if path is not None else {}
    source = str(path) if path is not None else "<defaults>"
    properties.update(parse_overrides(overrides))
    try:
        return parse(properties, source=source)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def effective(config: Config) -> list[tuple[ConfigKey[Any], Any, bool]]:
    """(key, value, is_default) of every key, secrets masked: for `config check`."""
    rows = []
    for key in _KEYS:
        value = config.values[key.name]
        shown = "[hidden]" if key.secret and value else value
        rows.append((key, shown, key.default == value))
    return rows
