"""One fetch quota for all the worker processes of a `tierproxy serve` (KIP-956's
`remote.log.manager.fetch.max.bytes.per.second` is the whole proxy's, as it is a broker's).

The supervisor creates a small file (`create`) that every worker maps (`SharedQuotaFile`)
and changes only under an exclusive `flock`: a change is a store read of a few chunks or a
connection joining or leaving the line, so the lock is cheap. The file holds

- Kafka's `SampledStat` samples of the one rate: (start, value) per sample, which sample is
  current and how many have begun (`SharedSampledRate`);
- per worker, the bytes its turns set aside for reads not yet done (`reserve`), so that a
  worker restarted after a crash starts from none;
- the line of connections held back (proxy/fetch_turns.py): a ticket counter, so that the
  connection held back first, in any worker, reads first, and per worker the tickets of
  its connections that hold back those behind them, each until when (inf while it asks).

Times are `time.monotonic()`, one clock for every process on the host (CLOCK_MONOTONIC).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
from collections.abc import Iterator, Sequence

from .quota import SampledRate

__all__ = ("LINE_ENTRIES", "SharedQuotaFile", "SharedSampledRate", "create")

# samples, workers, next ticket, current sample, samples begun
_HEADER = struct.Struct("<qqqqq")
_SAMPLE = struct.Struct("<dd")  # start, value
_RESERVED = struct.Struct("<d")
_ENTRY = struct.Struct("<qd")  # ticket, holds back those behind it until (0: unused)
#: entries of one worker's line kept in the file: the first this many that hold others back
LINE_ENTRIES = 64


def _size(samples: int, workers: int) -> int:
    return (_HEADER.size + samples * _SAMPLE.size + workers * _RESERVED.size
            + workers * LINE_ENTRIES * _ENTRY.size)


def create(path: str, samples: int, workers: int) -> None:
    """The file for `workers` processes sharing a rate of `samples` samples: nothing recorded."""
    with open(path, "wb") as f:
        f.write(bytes(_size(samples, workers)))
        f.seek(0)
        f.write(_HEADER.pack(samples, workers, 1, 0, 0))


class SharedQuotaFile:
    """One worker's view of the file (`worker` is its index)."""

    def __init__(self, path: str, worker: int) -> None:
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, 0)
        self.samples, self.workers, *_ = _HEADER.unpack_from(self._map, 0)
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} of a fetch quota file for {self.workers}")
        self.worker = worker
        self._depth = 0
        self._samples_at = _HEADER.size
        self._reserved_at = self._samples_at + self.samples * _SAMPLE.size
        self._line_at = self._reserved_at + self.workers * _RESERVED.size
        with self.locked():  # what a previous process of this worker left is void
            self.set_reserved(0)
            self.set_line([])

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive use of the file among the workers; re-entrant within one."""
        if self._depth == 0:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    # the rate's samples (call under `locked`)

    def load_rate(self, rate: SampledRate) -> None:
        _, _, _, current, begun = _HEADER.unpack_from(self._map, 0)
        rate._starts, rate._values = [], []
        for i in range(begun):
            start, value = _SAMPLE.unpack_from(self._map, self._samples_at + i * _SAMPLE.size)
            rate._starts.append(start)
            rate._values.append(value)
        rate._current = current

    def store_rate(self, rate: SampledRate) -> None:
        samples, workers, ticket, _, _ = _HEADER.unpack_from(self._map, 0)
        _HEADER.pack_into(self._map, 0, samples, workers, ticket, rate._current, len(rate._starts))
        for i, (start, value) in enumerate(zip(rate._starts, rate._values)):
            _SAMPLE.pack_into(self._map, self._samples_at + i * _SAMPLE.size, start, value)

    # bytes set aside

    def set_reserved(self, nbytes: float) -> None:
        with self.locked():
            _RESERVED.pack_into(self._map, self._reserved_at + self.worker * _RESERVED.size, nbytes)

    def reserved_elsewhere(self) -> float:
        with self.locked():
            return sum(_RESERVED.unpack_from(self._map, self._reserved_at + w * _RESERVED.size)[0]
                       for w in range(self.workers) if w != self.worker)

    # the line

    def next_ticket(self) -> int:
        with self.locked():
            samples, workers, ticket, current, begun = _HEADER.unpack_from(self._map, 0)
            _HEADER.pack_into(self._map, 0, samples, workers, ticket + 1, current, begun)
            return ticket

    def set_line(self, entries: Sequence[tuple[int, float]]) -> None:
        """This worker's (ticket, holds back until) in ticket order; the first LINE_ENTRIES."""
        at = self._line_at + self.worker * LINE_ENTRIES * _ENTRY.size
        with self.locked():
            for i in range(LINE_ENTRIES):
                ticket, until = entries[i] if i < len(entries) else (0, 0.0)
                _ENTRY.pack_into(self._map, at + i * _ENTRY.size, ticket, until)

    def ahead_elsewhere(self, ticket: int, now: float) -> bool:
        """Whether another worker's connection with an earlier ticket holds back `ticket` now."""
        with self.locked():
            for w in range(self.workers):
                if w == self.worker:
                    continue
                at = self._line_at + w * LINE_ENTRIES * _ENTRY.size
                for i in range(LINE_ENTRIES):
                    other, until = _ENTRY.unpack_from(self._map, at + i * _ENTRY.size)
                    if other == 0 or other >= ticket:
                        break  # entries are in ticket order
                    if now < until:
                        return True
        return False


class SharedSampledRate(SampledRate):
    """The one rate of all the workers: Kafka's `SimpleRate` over samples kept in the file.
    Each call reads the samples, works as `SampledRate` does and writes them back, under the
    file's lock; bytes other workers set aside count as recorded (see `RateQuota.reserve`)."""

    def __init__(self, shared: SharedQuotaFile, window_s: float) -> None:
        super().__init__(shared.samples, window_s)
        self.shared = shared
        self._in_sync = False

    @contextlib.contextmanager
    def _synced(self) -> Iterator[None]:
        if self._in_sync:  # measure asks window_size: the samples are loaded already
            yield
            return
        with self.shared.locked():
            self.shared.load_rate(self)
            self._in_sync = True
            try:
                yield
            finally:
                self._in_sync = False
            self.shared.store_rate(self)

    def record(self, value: float, now: float) -> None:
        with self._synced():
            super().record(value, now)

    def window_size(self, now: float) -> float:
        with self._synced():
            return super().window_size(now)

    def measure(self, now: float, extra: float = 0.0) -> float:
        with self._synced():
            return super().measure(now, extra + self.shared.reserved_elsewhere())

    def set_reserved(self, nbytes: float) -> None:
        self.shared.set_reserved(nbytes)

