"""Byte-bounded caches in front of the remote tier.

- `index_cache.RemoteIndexCache`: a segment's offset, time and transaction indexes,
  parsed, weighted by their file bytes, optionally kept on disk (Kafka's
  `RemoteIndexCache`).
- `chunk_cache.ChunkCache`: a segment's `.log` bytes in fixed, aligned chunks, with
  read-ahead for sequential readers.
- `single_flight.SingleFlight`: one load per key under concurrency, shared by both.

The caches count what they do through `CacheMetrics`; the proxy plugs in its
Prometheus counters (`remote_log.metrics`), tests and tools may leave the no-op.
"""

from __future__ import annotations

from typing import Protocol


class CacheMetrics(Protocol):
    def hit(self) -> None: ...

    def miss(self) -> None: ...

    def evicted(self, count: int = 1) -> None: ...

    def prefetched(self) -> None: ...

    def size(self, nbytes: int, entries: int) -> None:
        """Bytes and entries held now."""

    def loaded(self, topic: str, nbytes: int) -> None:
        """Bytes read from remote storage into the cache."""


class NoCacheMetrics:
    def hit(self) -> None:
        pass

    def miss(self) -> None:
        pass

    def evicted(self, count: int = 1) -> None:
        pass

    def prefetched(self) -> None:
        pass

    def size(self, nbytes: int, entries: int) -> None:
        pass

    def loaded(self, topic: str, nbytes: int) -> None:
        pass


NO_METRICS: CacheMetrics = NoCacheMetrics()
