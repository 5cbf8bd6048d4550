"""Prometheus metrics of remote reads, the reader pool and the caches (KIP-405's names, adapted).

| KIP-405                        | here                                                     |
|--------------------------------|----------------------------------------------------------|
| RemoteReadRequestsPerSec       | tierproxy_remote_read_requests_total{topic}              |
| RemoteBytesInPerSec            | tierproxy_remote_bytes_in_total{topic} (read from store) |
| RemoteReadErrorPerSec          | tierproxy_remote_read_errors_total{topic,reason}         |
| RemoteLogReaderTaskQueueSize   | tierproxy_remote_log_reader_task_queue_size (now), rate(..._task_queue_seconds_total) (average) |
| RemoteLogReaderAvgIdlePercent  | tierproxy_remote_log_reader_avg_idle_percent (0..1 now, as Kafka's), 1 - rate(..._busy_seconds_total) / ..._threads (average) |

plus the record bytes served (`tierproxy_remote_fetch_bytes_total{topic}`), remote
fetches that ran out of `remote.fetch.max.wait.ms` (`..._remote_fetch_expired_total`) or
were cut short for room in the chunk cache (`..._remote_fetch_cut_short_total`) and, per
cache (`cache` = index | chunk), hits, misses, evictions, prefetches, bytes and entries. Rates are Prometheus' job (`rate(...[1m])`).

Everything is registered on the CollectorRegistry passed in, so a test builds a
fresh one and reads values back with `value()`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tierproxy.cache import CacheMetrics
from tierproxy.protocol.apis import error_name
from tierproxy.storage.metadata import MetadataProblem, ProblemKind

from .failures import Cause


# From a cache hit (sub-millisecond) to a store that takes seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class RemoteMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.read_requests = Counter(
            "tierproxy_remote_read_requests", "Remote reads asked for, by topic.", ["topic"], registry=r)
        self.bytes_in = Counter(
            "tierproxy_remote_bytes_in", "Bytes read from remote storage, by topic.", ["topic"], registry=r)
        self.fetch_bytes = Counter(
            "tierproxy_remote_fetch_bytes", "Record bytes served from remote segments, by topic.", ["topic"],
            registry=r)
        self.read_errors = Counter(
            "tierproxy_remote_read_errors", "Remote reads that failed or stopped at corrupt data, by topic and reason (remote_log/failures.py's "
            "causes).", ["topic", "reason"],
            registry=r)
        self.fetch_expired = Counter(
            "tierproxy_remote_fetch_expired",
            "Remote reads still running when remote.fetch.max.wait.ms ran out (answered with empty records), "
            "or remote.list.offsets.request.timeout.ms for a ListOffsets lookup (REQUEST_TIMED_OUT).",
            ["topic"], registry=r)
        self.fetch_cut_short = Counter(
            "tierproxy_remote_fetch_cut_short",
            "Remote reads that ended before their bytes (answered with the records read so far, possibly none, "
            "no error): the chunk cache's bound was full of chunks that responses hold, the read's own response "
            "among them.", ["topic"], registry=r)
        self.not_available = Counter(
            "tierproxy_tiered_storage_not_available",
            "Fetch partitions answered TIERED_STORAGE_NOT_AVAILABLE (sent as "
            "tiered.storage.not.available.error.code), by topic and cause (remote_log/failures.py's causes).",
            ["topic", "cause"], registry=r)
        self.remote_partitions_served = Counter(
            "tierproxy_remote_partitions_served",
            "Fetch partitions answered from the remote tier, by topic.", ["topic"], registry=r)
        self.reader_queue_size = Gauge(
            "tierproxy_remote_log_reader_task_queue_size",
            "Remote reads waiting for a reader at the scrape (an instant: the average over time is "
            "rate(tierproxy_remote_log_reader_task_queue_seconds_total)).", registry=r,
            multiprocess_mode="livesum")
        self.reader_avg_idle = Gauge(
            "tierproxy_remote_log_reader_avg_idle_percent",
            "Share of remote log readers idle at the scrape (0..1, Kafka's RemoteLogReaderAvgIdlePercent; "
            "with several workers, the busiest worker's; the average over time is 1 - "
            "rate(tierproxy_remote_log_reader_busy_seconds_total) / tierproxy_remote_log_reader_threads).",
            registry=r, multiprocess_mode="livemin")
        self.reader_threads = Gauge(
            "tierproxy_remote_log_reader_threads", "Remote log readers (remote.log.reader.threads, every worker's).",
            registry=r, multiprocess_mode="livesum")
        self.reader_busy_seconds = Counter(
            "tierproxy_remote_log_reader_busy_seconds",
            "Seconds remote log readers spent reading, summed over the readers: its rate is the average number "
            "of busy readers.", registry=r)
        self.reader_queue_seconds = Counter(
            "tierproxy_remote_log_reader_task_queue_seconds",
            "Seconds remote reads spent waiting for a reader, summed over the reads: its rate is the average "
            "number waiting (RemoteLogReaderTaskQueueSize averaged).", registry=r)
        self.cache_hits = Counter("tierproxy_cache_hits", "Cache lookups answered from memory.", ["cache"],
                                  registry=r)
        self.cache_misses = Counter("tierproxy_cache_misses", "Cache lookups that waited for a load.", ["cache"],
                                    registry=r)
        self.cache_evictions = Counter("tierproxy_cache_evictions", "Entries evicted to make room.", ["cache"],
                                       registry=r)
        self.cache_prefetches = Counter("tierproxy_cache_prefetches", "Loads started ahead of a reader.", ["cache"],
                                        registry=r)
        self.cache_bytes = Gauge("tierproxy_cache_bytes", "Bytes counted against the cache's bound.", ["cache"],
                                 registry=r, multiprocess_mode="livesum")
        self.cache_entries = Gauge("tierproxy_cache_entries", "Entries held.", ["cache"], registry=r,
                                   multiprocess_mode="livesum")
        self.fetch_throttle_seconds = Histogram(
            "tierproxy_remote_fetch_throttle_seconds",
            "Time a Fetch's remote partitions were held back by the fetch quota "
            "(remote.log.manager.fetch.max.bytes.per.second; Kafka's remote-fetch-throttle-time) "
            "waiting for its turn: held back to the end, they are answered with empty records, no error.",
            buckets=LATENCY_BUCKETS, registry=r)
        self.read_seconds = Histogram(
            "tierproxy_remote_read_seconds",
            "Remote reads from the fetch's submission to its answer, by outcome (ok, error, expired, queue_full).",
            ["outcome"], buckets=LATENCY_BUCKETS, registry=r)
        self.storage_request_seconds = Histogram(
            "tierproxy_remote_storage_request_seconds",
            "Requests to the object store, each attempt, by operation (get, get_range, head, put, ...) and "
            "outcome (ok, error).", ["operation", "outcome"], buckets=LATENCY_BUCKETS, registry=r)
        self.broker_query_seconds = Histogram(
            "tierproxy_broker_query_seconds",
            "The proxy's own requests on a client's connection (Metadata, ListOffsets, Fetch), by API.",
            ["api"], buckets=LATENCY_BUCKETS, registry=r)
        self.partition_errors = Counter(
            "tierproxy_partition_errors",
            "Partitions the proxy itself answered with an error in a Fetch, ListOffsets or OffsetForLeaderEpoch, "
            "by API and Kafka error name.", ["api", "error"], registry=r)

        self.metadata_unreadable = Gauge(
            "tierproxy_remote_log_metadata_unreadable",
            "1 while the remote log metadata cannot be read as a whole, by problem: no_metadata (nothing "
            "published under the store's key prefix, remote.log.metadata.backend=remote), damaged (an object "
            "missing, truncated or that does not decode); 0 otherwise.", ["problem"], registry=r,
            multiprocess_mode="livemax")

    def cache(self, name: str) -> CacheMetrics:
        """The counters of one cache, in the shape `cache/` expects."""
        return _PrometheusCacheMetrics(self, name)

    def read_error(self, topic: str, reason: Cause) -> None:
        self.read_errors.labels(topic, reason.value).inc()

    def tiered_storage_not_available(self, topic: str, cause: Cause) -> None:
        self.not_available.labels(topic, cause.value).inc()

    def metadata_problem(self, problem: MetadataProblem | None) -> None:
        """The metadata manager's `observe_problems` hook."""
        for kind in ProblemKind:
            self.metadata_unreadable.labels(kind.value).set(1 if problem is not None and problem.kind is kind else 0)

    def partition_error(self, api: str, code: int) -> None:
        self.partition_errors.labels(api, error_name(code)).inc()

    def store_request(self, operation: str, seconds: float, ok: bool) -> None:
        """The RemoteStorageManager's `observe_request` hook."""
        self.storage_request_seconds.labels(operation, "ok" if ok else "error").observe(seconds)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (0 if never set): for tests and summaries."""
        return self.registry.get_sample_value(name, labels or {}) or 0.0


class _PrometheusCacheMetrics:
    def __init__(self, metrics: RemoteMetrics, name: str) -> None:
        self._metrics = metrics
        self._hits = metrics.cache_hits.labels(name)
        self._misses = metrics.cache_misses.labels(name)
        self._evictions = metrics.cache_evictions.labels(name)
        self._prefetches = metrics.cache_prefetches.labels(name)
        self._bytes = metrics.cache_bytes.labels(name)
        self._entries = metrics.cache_entries.labels(name)

    def hit(self) -> None:
        self._hits.inc()

    def miss(self) -> None:
        self._misses.inc()

    def evicted(self, count: int = 1) -> None:
        self._evictions.inc(count)

    def prefetched(self) -> None:
        self._prefetches.inc()

    def size(self, nbytes: int, entries: int) -> None:
        self._bytes.set(nbytes)
        self._entries.set(entries)

    def loaded(self, topic: str, nbytes: int) -> None:
        self._metrics.bytes_in.labels(topic).inc(nbytes)
