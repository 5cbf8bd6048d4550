"""The proxy's memory bound: one formula of the settings, with the constants measured for it.

docs/operations.md ("Memory") shows `formula_text()`, tests/proxy/test_memory_bound.py holds
the resident memory of a running `serve` (supervisor and workers) under `memory_bound()`, and
benchmarks/adversarial.py checks its peak against it: the numbers live here only. The
constants are resident set sizes measured with `tests/proxy/test_memory_bound.py` (see
benchmarks/RESULTS.md), rounded up; RSS counts the pages the processes share (the
interpreter, libraries) once per process, as `ps` and the kernel's OOM accounting do.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierproxy.config import (
    Config,
    REMOTE_LOG_STORAGE_BACKEND,
    MAX_PENDING_RESPONSE_BYTES_PER_CONNECTION,
    REMOTE_LOG_CHUNK_CACHE_SIZE_BYTES,
    REMOTE_LOG_CHUNK_SIZE_BYTES,
    REMOTE_LOG_INDEX_FILE_CACHE_TOTAL_SIZE_BYTES,
    REMOTE_LOG_READER_THREADS,
)

from .workers import shares, worker_count

__all__ = ("CONNECTION_BYTES", "PROCESS_BYTES", "S3_CLIENT_BYTES", "SUPERVISOR_BYTES", "Load", "formula_text", "memory_bound")

MIB = 1 << 20
# The command supervising workers (proxy.workers above 1): the interpreter, the start-up
# checks' imports (Kafka client, object store client), the metrics endpoint. Measured 61-62 MiB.
SUPERVISOR_BYTES = 72 * MIB
# One process serving clients, its caches aside: the interpreter, the proxy's imports, the
# preloaded codecs, its threads and the allocator's arenas. Measured 70-71 MiB idle, 75 MiB
# once 8 consumers replayed through it.
PROCESS_BYTES = 80 * MIB
# A process's object store client with remote.log.storage.backend=s3 (botocore's service
# models, aiobotocore, aiohttp), the supervisor's too (its start-up probe of the store).
# Measured 30-32 MiB per worker and in the supervisor, 43 MiB for one process serving alone.
S3_CLIENT_BYTES = 48 * MIB
# Any open client connection: its transports, buffers, the paired broker connection.
CONNECTION_BYTES = 64 * 1024


@dataclass(frozen=True)
class Load:
    """What the clients bring: open connections, those of them fetching, the broker bytes
    one Fetch response of each of those may carry, summed (each client's `fetch.max.bytes`,
    at most the broker's), the requests being received (each at most `socket.request.max.bytes`, or
    `sasl.server.max.receive.size` before a SASL login), and the remote log metadata one
    process holds (docs/operations.md, "Remote log metadata at scale")."""

    connections: int = 0
    fetching: int = 0
    fetch_bytes: int = 0
    request_bytes: int = 0
    metadata_bytes: int = 0


def memory_bound(config: Config, load: Load) -> int:
    """Bytes the whole `serve` (supervisor and workers) stays within under `load`."""
    workers = worker_count(config)
    share = {name: int(value) for name, value in shares(config, workers).items()}
    chunk = config[REMOTE_LOG_CHUNK_SIZE_BYTES]
    client = S3_CLIENT_BYTES if config[REMOTE_LOG_STORAGE_BACKEND] == "s3" else 0
    per_worker = (PROCESS_BYTES + client + load.metadata_bytes + share[REMOTE_LOG_CHUNK_CACHE_SIZE_BYTES]
                  + share[REMOTE_LOG_INDEX_FILE_CACHE_TOTAL_SIZE_BYTES] + share[REMOTE_LOG_READER_THREADS] * chunk)
    return ((SUPERVISOR_BYTES + client if workers > 1 else 0) + workers * per_worker
            + load.fetching * config[MAX_PENDING_RESPONSE_BYTES_PER_CONNECTION] + load.fetch_bytes
            + load.connections * CONNECTION_BYTES + load.request_bytes)


def formula_text() -> str:
    """The formula as docs/operations.md shows it."""
    lines = [
        ("supervisor (with proxy.workers above 1)", f"{SUPERVISOR_BYTES // MIB} MiB"),
        ("+ proxy.workers x idle process", f"{PROCESS_BYTES // MIB} MiB each"),
        ("+ with remote.log.storage.backend=s3, per process", f"{S3_CLIENT_BYTES // MIB} MiB (the object store client;"),
        ("", "the supervisor's too)"),
        ("+ proxy.workers x remote log metadata", '(see "Remote log metadata at scale" below)'),
        ("+ remote.log.chunk.cache.size.bytes + remote.log.index.file.cache.total.size.bytes", ""),
        ("+ remote.log.reader.threads x remote.log.chunk.size.bytes", "(reads in flight)"),
        ("+ per client connection that fetches: max.pending.response.bytes.per.connection", ""),
        ("  + the broker's part of one Fetch response", "(the client's fetch.max.bytes)"),
        (f"+ {CONNECTION_BYTES // 1024} KiB per open client connection", ""),
        ("+ the requests being received", "(each at most socket.request.max.bytes, or"),
        ("", "sasl.server.max.receive.size before a SASL login)"),
    ]
    return "".join(f"    {what:<58} {value}".rstrip() + "\n" for what, value in lines)
