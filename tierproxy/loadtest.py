"""`tierproxy loadtest`: replay a topic's history with N concurrent consumers, to size the proxy.

Works against any endpoint, the proxy or a broker. Each consumer is a confluent-kafka
(librdkafka) Consumer in a thread of its own: librdkafka fetches and decompresses in its
own threads and releases the GIL while it waits, so the Python side only counts the
messages. The topic's partitions are assigned round-robin across the consumers with
`assign` and explicit start offsets; there is no consumer group and nothing is committed.

A run ends at the end of every assigned partition (`enable.partition.eof`: the high
watermark, or the last stable offset with read_committed), after `--duration` seconds, or
after `--max-records` records, whichever comes first.

What the summary means:

- `records`, `bytes`: messages delivered to the consumers and their key + value bytes
  (what an application receives, not the compressed wire bytes).
- `MB/s`, `records/s`: over the wall time from the first assignment to the end.
- fetch latency: librdkafka's broker round-trip time (`statistics.interval.ms` ->
  brokers[].rtt: a request sent to a response received, per broker connection; a
  consumer's requests are almost all Fetch). librdkafka reports one histogram summary
  per statistics window; the windows are merged by weighting each window's quantile
  points by its request count, each quantile range counted at its upper bound, so the
  merged p50/p99 are exact for one window and never below the truth for several.
- errors: every KafkaError the consumers saw (message errors and client errors), by
  librdkafka's name (UNKNOWN_TOPIC_OR_PART, _TRANSPORT, ...); partition EOF is not one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = (
    "LatencyWindow",
    "LoadTest",
    "StartPosition",
    "Summary",
    "merge_latency",
    "parse_start",
    "run",
)

MB = 1_000_000
CONSUME_BATCH = 1000
CONSUME_TIMEOUT_S = 0.2
METADATA_TIMEOUT_S = 10.0
PROGRESS_INTERVAL_S = 1.0
# (quantile, key) points of a librdkafka histogram summary, in ascending order.
_QUANTILES = ((0.0, "min"), (0.50, "p50"), (0.75, "p75"), (0.90, "p90"), (0.95, "p95"), (0.99, "p99"),
              (0.9999, "p99_99"), (1.0, "max"))


# ---------------------------------------------------------------------- start position


@dataclass(frozen=True, slots=True)
class StartPosition:
    """Where every partition starts: `earliest`, an `offset`, or the first offset at or
    after a `timestamp` (ms since the epoch)."""

    kind: str
    value: int = 0

    def __str__(self) -> str:
        return "earliest" if self.kind == "earliest" else f"{self.kind} {self.value}"


def parse_start(text: str) -> StartPosition:
    """`earliest`; an offset (`1200`); a timestamp as `@<ms since the epoch>` or ISO 8601
    (`2026-11-21T10:00:00Z`, no zone means UTC)."""
    text = text.strip()
    if text == "earliest":
        return StartPosition("earliest")
    if text.startswith("@") and text[1:].isdigit():
        return StartPosition("timestamp", int(text[1:]))
    if text.isdigit():
        return StartPosition("offset", int(text))
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--from {text!r}: expected earliest, an offset, @<timestamp ms> or an ISO 8601 time")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return StartPosition("timestamp", int(moment.timestamp() * 1000))


# ---------------------------------------------------------------------- latency


@dataclass(frozen=True, slots=True)
class LatencyWindow:
    """One statistics window of one broker connection: request count and quantile points (µs)."""

    count: int
    points: tuple[tuple[float, float], ...]  # (quantile, microseconds), ascending

    @classmethod
    def from_rtt(cls, rtt: dict[str, Any]) -> LatencyWindow | None:
        count = int(rtt.get("cnt", 0))
        if count <= 0:
            return None
        return cls(count, tuple((q, float(rtt[key])) for q, key in _QUANTILES if key in rtt))


def merge_latency(windows: Sequence[LatencyWindow], quantiles: Sequence[float]) -> list[float | None]:
    """Quantiles (µs) of the union of the windows, each window's mass between two of its
    quantile points placed at the upper one (never below the true value)."""
    weighted: list[tuple[float, float]] = []
    for window in windows:
        previous = 0.0
        for q, value in window.points:
            if q > previous or q == 0.0:
                weighted.append((value, (q - previous) * window.count))
            previous = q
    weighted = [(v, w) for v, w in weighted if w > 0]
    if not weighted:
        return [None for _ in quantiles]
    weighted.sort()
    total = sum(w for _, w in weighted)
    out: list[float | None] = []
    for q in quantiles:
        target, running = q * total, 0.0
        answer = weighted[-1][0]
        for value, w in weighted:
            running += w
            if running >= target - 1e-9:
                answer = value
                break
        out.append(answer)
    return out


# ---------------------------------------------------------------------- the run


@dataclass
class Summary:
    bootstrap: str
    topic: str
    consumers: int
    partitions: int
    start: str
    isolation: str
    replays: int = 1
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    stopped_by: str = ""
    partitions_at_end: int = 0
    fetch_latency_p50_ms: float | None = None
    fetch_latency_p99_ms: float | None = None
    fetch_latency_requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds > 0 else 0.0

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "bootstrap": self.bootstrap,
            "topic": self.topic,
            "consumers": self.consumers,
            "replays": self.replays,
            "partitions": self.partitions,
            "from": self.start,
            "isolation": self.isolation,
            "records": self.records,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "mb_per_s": round(self.mb_per_s, 3),
            "records_per_s": round(self.records_per_s, 1),
            "stopped_by": self.stopped_by,
            "partitions_at_end": self.partitions_at_end,
            "fetch_latency_ms": {
                "p50": _round(self.fetch_latency_p50_ms),
                "p99": _round(self.fetch_latency_p99_ms),
                "requests": self.fetch_latency_requests,
                "meaning": "broker round-trip time of the consumers' requests (librdkafka brokers[].rtt)",
            },
            "errors": dict(sorted(self.errors.items())),
        }

    def text(self) -> str:
        def ms(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.1f} ms"

        errors = ", ".join(f"{name} x{count}" for name, count in sorted(self.errors.items())) or "none"
        return "\n".join([
            f"topic {self.topic} via {self.bootstrap}: {self.partitions} partitions, {self.consumers} consumers"
            + (f" in each of {self.replays} replays" if self.replays > 1 else "")
            + f", from {self.start}, {self.isolation}",
            f"  {self.records:,} records, {self.bytes / MB:,.1f} MB in {self.seconds:.2f} s "
            f"(stopped by {self.stopped_by}; {self.partitions_at_end}/{self.partitions * self.replays} partitions "
            f"at their end)",
            f"  {self.mb_per_s:,.1f} MB/s, {self.records_per_s:,.0f} records/s",
            f"  fetch latency (broker round trip, {self.fetch_latency_requests:,} requests): "
            f"p50 {ms(self.fetch_latency_p50_ms)}, p99 {ms(self.fetch_latency_p99_ms)}",
            f"  errors: {errors}",
        ])


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class _Totals:
    """What every consumer thread adds to, under one lock."""

    def __init__(self, max_records: int | None) -> None:
        self.lock = threading.Lock()
        self.records = 0
        self.bytes = 0
        self.errors: Counter[str] = Counter()
        self.windows: list[LatencyWindow] = []
        self.remaining = max_records  # None: no bound
        self.done = threading.Event()  # every consumer reached its end, or a bound was hit
        self.stopped_by = ""

    def take(self, wanted: int) -> int:
        """How many of `wanted` records may still be counted (the --max-records budget)."""
        with self.lock:
            if self.remaining is None:
                return wanted
            granted = min(wanted, self.remaining)
            self.remaining -= granted
            if self.remaining == 0:
                self.stop("max-records")
            return granted

    def add(self, records: int, size: int) -> None:
        with self.lock:
            self.records += records
            self.bytes += size

    def error(self, name: str) -> None:
        with self.lock:
            self.errors[name] += 1

    def stop(self, reason: str) -> None:
        if not self.done.is_set():
            self.stopped_by = self.stopped_by or reason
            self.done.set()


class LoadTest:
    """One load test run; `run()` returns its Summary."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        consumers: int = 1,
        replays: int = 1,
        start: StartPosition = StartPosition("earliest"),
        duration_s: float | None = None,
        max_records: int | None = None,
        isolation: str = "read_uncommitted",
        stats_interval_ms: int = 1000,
        client_config: dict[str, Any] | None = None,
        progress: TextIO | None = None,
    ) -> None:
        if consumers < 1:
            raise ValueError("--consumers must be at least 1")
        if replays < 1:
            raise ValueError("--replays must be at least 1")
        if isolation not in ("read_committed", "read_uncommitted"):
            raise ValueError(f"--isolation {isolation!r}: read_committed or read_uncommitted")
        self.bootstrap = bootstrap
        self.topic = topic
        self.consumers = consumers
        self.replays = replays
        self.start = start
        self.duration_s = duration_s
        self.max_records = max_records
        self.isolation = isolation
        self.stats_interval_ms = stats_interval_ms
        self.client_config = dict(client_config or {})
        self.progress = progress

    def config(self, totals: _Totals) -> dict[str, Any]:
        def on_error(error: Any) -> None:
            totals.error(error.name())

        def on_stats(document: str) -> None:
            for broker in json.loads(document).get("brokers", {}).values():
                # Bootstrap connections (nodeid -1) only ask for metadata.
                if broker.get("nodeid", -1) < 0:
                    continue
                window = LatencyWindow.from_rtt(broker.get("rtt") or {})
                if window is not None:
                    with totals.lock:
                        totals.windows.append(window)

        return {
            "bootstrap.servers": self.bootstrap,
            # Required by the client, unused: partitions are assigned and nothing is committed.
            "group.id": "tierproxy-loadtest",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "allow.auto.create.topics": False,
            "isolation.level": self.isolation,
            "statistics.interval.ms": self.stats_interval_ms,
            "stats_cb": on_stats,
            "error_cb": on_error,
            **self.client_config,
        }

    def run(self) -> Summary:
        from confluent_kafka import Consumer, KafkaException

        totals = _Totals(self.max_records)
        summary = Summary(self.bootstrap, self.topic, self.consumers, 0, str(self.start), self.isolation,
                          self.replays)
        consumers = [Consumer(self.config(totals)) for _ in range(self.consumers * self.replays)]
        try:
            try:
                assignments = self._assignments(consumers[0])
            except KafkaException as e:
                totals.error(e.args[0].name())
                assignments = []
            summary.partitions = sum(len(a) for a in assignments) // self.replays
            if summary.partitions == 0:
                summary.stopped_by = "no partitions"
                return self._finish(summary, totals, 0.0, Counter())
            at_end: Counter[int] = Counter()
            started = time.perf_counter()
            working = [(i, c, p) for i, (c, p) in enumerate(zip(consumers, assignments)) if p]
            live = [len(working)]
            live_lock = threading.Lock()

            def consumer_done() -> None:
                with live_lock:
                    live[0] -= 1
                    if live[0] == 0:
                        totals.stop("end")

            threads = [
                threading.Thread(target=self._consume, args=(i, consumer, partitions, totals, at_end, consumer_done),
                                 name=f"loadtest-consumer-{i}", daemon=True)
                for i, consumer, partitions in working
            ]
            for thread in threads:
                thread.start()
            self._wait(totals, started)
            for thread in threads:
                thread.join()
            return self._finish(summary, totals, time.perf_counter() - started, at_end)
        finally:
            for consumer in consumers:
                consumer.close()

    # --- parts --------------------------------------------------------------------------

    def _assignments(self, consumer: Any) -> list[list[Any]]:
        """The topic's partitions with their start offsets, round-robin over the consumers
        of each replay: every replay reads every partition, as one consumer group would."""
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, TopicPartition

        metadata = consumer.list_topics(self.topic, timeout=METADATA_TIMEOUT_S)
        described = metadata.topics.get(self.topic)
        if described is None or described.error is not None:
            error = described.error if described is not None else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            raise KafkaException(error)
        numbers = sorted(described.partitions)
        if self.start.kind == "earliest":
            starts = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in numbers]
        elif self.start.kind == "offset":
            starts = [TopicPartition(self.topic, p, self.start.value) for p in numbers]
        else:
            asked = [TopicPartition(self.topic, p, self.start.value) for p in numbers]
            starts = []
            for answer in consumer.offsets_for_times(asked, timeout=METADATA_TIMEOUT_S):
                if answer.error is not None:
                    raise KafkaException(answer.error)
                # -1: no record at or after the timestamp, start at the end.
                starts.append(TopicPartition(self.topic, answer.partition,
                                             answer.offset if answer.offset >= 0 else OFFSET_END))
        return [starts[i::self.consumers] for _ in range(self.replays) for i in range(self.consumers)]

    def _consume(self, index: int, consumer: Any, partitions: list[Any], totals: _Totals,
                 at_end: Counter[int], on_exit: Callable[[], None]) -> None:
        from confluent_kafka import KafkaError

        eof = KafkaError._PARTITION_EOF
        pending = {tp.partition for tp in partitions}
        try:
            consumer.assign(partitions)
            while pending and not totals.done.is_set():
                messages = consumer.consume(CONSUME_BATCH, CONSUME_TIMEOUT_S)
                if not messages:
                    continue
                count = size = 0
                for message in messages:
                    error = message.error()
                    if error is None:
                        count += 1
                        key, value = message.key(), message.value()
                        size += (len(key) if key else 0) + (len(value) if value else 0)
                    elif error.code() == eof:
                        if message.partition() in pending:
                            pending.discard(message.partition())
                            with totals.lock:
                                at_end[index] += 1
                    else:
                        totals.error(error.name())
                granted = totals.take(count)
                if granted < count:  # the last records over --max-records: count their share
                    size = size * granted // count
                totals.add(granted, size)
            consumer.unassign()
        except Exception as e:  # counted, and the other consumers go on
            # A KafkaException carries a KafkaError (named) as its first argument.
            error = e.args[0] if e.args else None
            totals.error(error.name() if isinstance(error, KafkaError) else type(e).__name__)
        finally:
            on_exit()

    def _wait(self, totals: _Totals, started: float) -> None:
        """Print progress about every second until the run ends; enforce --duration."""
        deadline = started + self.duration_s if self.duration_s is not None else None
        while not totals.done.is_set():
            timeout = PROGRESS_INTERVAL_S
            if deadline is not None:
                timeout = min(timeout, max(deadline - time.perf_counter(), 0))
            if totals.done.wait(timeout):
                break
            if deadline is not None and time.perf_counter() >= deadline:
                totals.stop("duration")
                break
            self._progress(totals, started)
        if self.progress is not None and self.progress.isatty():
            print(file=self.progress)

    def _progress(self, totals: _Totals, started: float) -> None:
        if self.progress is None:
            return
        elapsed = time.perf_counter() - started
        with totals.lock:
            records, size, errors = totals.records, totals.bytes, sum(totals.errors.values())
        line = (f"{elapsed:6.1f}s  {records:>12,} records  {size / MB:>10,.1f} MB  "
                f"{size / MB / elapsed if elapsed else 0:>8,.1f} MB/s  errors {errors}")
        end = "\r" if self.progress.isatty() else "\n"
        print(line, end=end, file=self.progress, flush=True)

    def _finish(self, summary: Summary, totals: _Totals, seconds: float, at_end: Counter[int]) -> Summary:
        summary.records, summary.bytes, summary.seconds = totals.records, totals.bytes, seconds
        summary.stopped_by = summary.stopped_by or totals.stopped_by or "end"
        summary.partitions_at_end = sum(at_end.values())
        summary.errors = dict(totals.errors)
        p50, p99 = merge_latency(totals.windows, (0.50, 0.99))
        summary.fetch_latency_p50_ms = None if p50 is None else p50 / 1000
        summary.fetch_latency_p99_ms = None if p99 is None else p99 / 1000
        summary.fetch_latency_requests = sum(w.count for w in totals.windows)
        return summary


# ---------------------------------------------------------------------- the command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True, metavar="HOST:PORT",
                        help="the proxy or a broker, host:port[,host:port]")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--consumers", type=int, default=1, metavar="N",
                        help="concurrent consumers; partitions are assigned round-robin (default 1)")
    parser.add_argument("--replays", type=int, default=1, metavar="N",
                        help="independent replays at once, each of --consumers consumers reading every partition, "
                             "as N consumer groups backfilling together would (default 1)")
    parser.add_argument("--from", dest="start", type=_start_argument, default=StartPosition("earliest"),
                        metavar="earliest|OFFSET|TIMESTAMP",
                        help="where every partition starts: earliest (default), an offset, or a timestamp "
                             "as @<ms since the epoch> or ISO 8601 (2026-11-21T10:00:00Z)")
    parser.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                        help="stop after this long (default: at the end of the partitions)")
    parser.add_argument("--max-records", type=int, default=None, metavar="M", help="stop after M records")
    parser.add_argument("--isolation", choices=("read_uncommitted", "read_committed"), default="read_uncommitted")
    parser.add_argument("--stats-interval-ms", type=int, default=1000, metavar="MS",
                        help="librdkafka statistics window, the fetch latency's resolution (default 1000)")
    parser.add_argument("--config", metavar="FILE",
                        help="a tierproxy .properties file whose security keys (security.protocol, sasl.*, "
                             "ssl.*) the consumers use, e.g. to log in through the proxy with SCRAM")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="set a key on top of --config (repeatable)")
    parser.add_argument("-X", dest="client_config", action="append", default=[], metavar="KEY=VALUE",
                        help="a librdkafka consumer property (repeatable), e.g. -X fetch.max.bytes=104857600")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON document")


def _start_argument(text: str) -> StartPosition:
    try:
        return parse_start(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def parse_client_config(pairs: list[str]) -> dict[str, str]:
    config = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"-X {pair!r}: expected KEY=VALUE")
        config[key.strip()] = value.strip()
    return config


def _security_config(args: argparse.Namespace) -> dict[str, str]:
    """librdkafka's spelling of the security in --config (nothing without one)."""
    if args.config is None and not args.override:
        return {}
    from tierproxy.client.security import librdkafka_options
    from tierproxy.config import load

    # The file's bootstrap.servers is the cluster's; the consumers go to --bootstrap.
    return librdkafka_options(load(args.config, [*args.override, f"bootstrap.servers={args.bootstrap}"]))


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    try:
        test = LoadTest(
            args.bootstrap, args.topic, consumers=args.consumers, replays=args.replays, start=args.start,
            duration_s=args.duration, max_records=args.max_records, isolation=args.isolation,
            stats_interval_ms=args.stats_interval_ms,
            client_config={**_security_config(args), **parse_client_config(args.client_config)}, progress=stderr,
        )
    except ValueError as e:
        print(f"tierproxy loadtest: {e}", file=stderr)
        return 2
    summary = test.run()
    if args.json:
        print(json.dumps(summary.as_dict()), file=stdout)
    else:
        print(summary.text(), file=stdout)
    return 0 if summary.records > 0 or not summary.errors else 1
