"""The Iceberg catalog and the tables' settings, from tierproxy's configuration.

`iceberg.catalog.<property>` passes the catalog's own properties through under Iceberg's
names (`type`, `uri`, `warehouse`, `s3.endpoint`, `credential`, ...). When none is given,
the embedded default is a SQL catalog in a SQLite file beside the remote log metadata, with
the warehouse in the tier's own store: `<remote.log.storage.local.dir>/iceberg`, or
`s3://<bucket>/<key prefix>/iceberg` with the store's endpoint, region and credentials.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierproxy.config import (
    ICEBERG_CATALOG_PREFIX,
    ICEBERG_NAMESPACE,
    REMOTE_LOG_METADATA_DIR,
    REMOTE_LOG_STORAGE_BACKEND,
    REMOTE_LOG_STORAGE_KEY_PREFIX,
    REMOTE_LOG_STORAGE_LOCAL_DIR,
    REMOTE_LOG_STORAGE_S3_ACCESS_KEY_ID,
    REMOTE_LOG_STORAGE_S3_BUCKET,
    REMOTE_LOG_STORAGE_S3_ENDPOINT_URL,
    REMOTE_LOG_STORAGE_S3_REGION,
    REMOTE_LOG_STORAGE_S3_SECRET_ACCESS_KEY,
    Config,
)

CATALOG_NAME = "tierproxy"
SQLITE_FILE = Path("iceberg") / "catalog.db"


def catalog_properties(config: Config) -> dict[str, str]:
    """The catalog's properties: those given under `iceberg.catalog.`, or the embedded default."""
    given = config.prefixed(ICEBERG_CATALOG_PREFIX)
    if given:
        return given
    sqlite = Path(config[REMOTE_LOG_METADATA_DIR]).absolute() / SQLITE_FILE
    sqlite.parent.mkdir(parents=True, exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{sqlite}", **warehouse_properties(config)}


def warehouse_properties(config: Config) -> dict[str, str]:
    """The warehouse in the tier's own store, and how to reach it."""
    if config[REMOTE_LOG_STORAGE_BACKEND] == "local":
        return {"warehouse": (Path(config[REMOTE_LOG_STORAGE_LOCAL_DIR]).absolute() / "iceberg").as_uri()}
    prefix = config[REMOTE_LOG_STORAGE_KEY_PREFIX].strip("/")
    properties = {"warehouse": f"s3://{config[REMOTE_LOG_STORAGE_S3_BUCKET]}/{prefix + '/' if prefix else ''}iceberg",
                  "s3.region": config[REMOTE_LOG_STORAGE_S3_REGION]}
    if config[REMOTE_LOG_STORAGE_S3_ENDPOINT_URL]:
        properties["s3.endpoint"] = config[REMOTE_LOG_STORAGE_S3_ENDPOINT_URL]
    if config[REMOTE_LOG_STORAGE_S3_ACCESS_KEY_ID]:
        properties["s3.access-key-id"] = config[REMOTE_LOG_STORAGE_S3_ACCESS_KEY_ID]
        properties["s3.secret-access-key"] = config[REMOTE_LOG_STORAGE_S3_SECRET_ACCESS_KEY]
    return properties


def load_catalog(config: Config) -> Any:
    """The pyiceberg catalog the configuration names."""
    from pyiceberg.catalog import load_catalog as load

    return load(CATALOG_NAME, **catalog_properties(config))


@dataclass(frozen=True, slots=True)
class TableSettings:
    """One topic's table."""

    topic: str
    namespace: str
    partition_spec: str
    retention_ms: int

    @property
    def identifier(self) -> tuple[str, str]:
        # A tuple: topic names may hold dots, which a dotted identifier would read as namespaces.
        return (self.namespace, self.topic)

    @property
    def name(self) -> str:
        return f"{self.namespace}.{self.topic}"


def table_settings(config: Config, topic: str) -> TableSettings:
    settings = config.topic(topic)
    return TableSettings(topic, config[ICEBERG_NAMESPACE], settings.iceberg_partition_spec,
                         settings.iceberg_retention_ms)


def enabled_topics(config: Config) -> list[str]:
    """Tiered topics with `iceberg.enable=true`, by name."""
    return sorted(t.name for t in config.tiered_topics if t.iceberg_enable)
