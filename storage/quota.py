"""A byte-rate quota with Kafka's semantics (KIP-956, `RLMQuotaManager`), for copies to
and fetches from remote storage.

Kafka measures a `SimpleRate` over a `SampledStat`: `window.num` samples of
`window.size.seconds` each. A sample starts with the first value recorded after the
previous one completed; samples older than `window.num` windows are dropped. The rate is
the sum of the kept samples over max(time since the oldest sample began, one window).
When that rate is above the quota, the caller waits Kafka's `QuotaUtils.throttleTime`:

    (rate - quota) / quota * window

the delay that brings the rate back to the quota if nothing more is recorded. A copy
(`RemoteLogManager`'s copy task) waits while the throttle time is above zero, then
records the segment's size and copies it: copies wait, they never fail, and a segment
larger than what the quota allows in a window still goes, after its wait. As the rate
counts at least one window, up to quota x window.size.seconds bytes go at once after an
idle spell; from then on the total stays within the quota.

Fetches (`RemoteLogManager`'s remote reads) check the quota before they read and record
what they read. The proxy reads from the store in chunks and ahead of its readers, so it
records bytes as the store reads start, chunk runs and read-ahead included, and bytes set
aside (`reserve`) for reads admitted but not yet started count as recorded: reads admitted
at once do not all pass the same check. Read-ahead asks `allows` first, so speculation
never takes the rate past the quota.

Here, in storage/, because the pipeline's copies and the proxy's remote reads both use it,
as Kafka keeps it beside its remote storage code.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tierproxy.config import (
    REMOTE_LOG_MANAGER_COPY_MAX_BYTES_PER_SECOND,
    REMOTE_LOG_MANAGER_COPY_QUOTA_WINDOW_NUM,
    REMOTE_LOG_MANAGER_COPY_QUOTA_WINDOW_SIZE_SECONDS,
    REMOTE_LOG_MANAGER_FETCH_MAX_BYTES_PER_SECOND,
    REMOTE_LOG_MANAGER_FETCH_QUOTA_WINDOW_NUM,
    REMOTE_LOG_MANAGER_FETCH_QUOTA_WINDOW_SIZE_SECONDS,
    UNLIMITED_BYTES_PER_SECOND,
)

__all__ = ("QuotaSettings", "RateQuota", "SampledRate", "copy_quota_settings", "fetch_quota_settings")


class SampledRate:
    """Kafka's `SimpleRate` over a windowed sum: bytes per second over the kept samples."""

    def __init__(self, samples: int, window_s: float) -> None:
        if samples < 1 or window_s <= 0:
            raise ValueError(f"a sampled rate needs at least one sample of a positive window, got {samples} x "
                             f"{window_s}")
        self.samples = samples
        self.window_s = window_s
        self._starts: list[float] = []  # when each sample began
        self._values: list[float] = []
        self._current = 0

    def record(self, value: float, now: float) -> None:
        if not self._starts:
            self._starts.append(now)
            self._values.append(0.0)
        elif now - self._starts[self._current] >= self.window_s:  # the current sample is complete
            self._current = (self._current + 1) % self.samples
            if self._current >= len(self._starts):
                self._starts.append(now)
                self._values.append(0.0)
            else:
                self._starts[self._current], self._values[self._current] = now, 0.0
        self._values[self._current] += value

    def _purge(self, now: float) -> None:
        expire_s = self.samples * self.window_s
        for i, start in enumerate(self._starts):
            if now - start >= expire_s:
                self._starts[i], self._values[i] = now, 0.0

    def window_size(self, now: float) -> float:
        """Seconds the kept samples span, at least one window."""
        self._purge(now)
        oldest = min(self._starts, default=now)
        return max(now - oldest, self.window_s)

    def measure(self, now: float, extra: float = 0.0) -> float:
        """The rate, with `extra` counted as if recorded now."""
        self._purge(now)
        return (sum(self._values) + extra) / self.window_size(now)

    def set_reserved(self, nbytes: float) -> None:
        """This process's bytes set aside; only a rate shared with other processes keeps them."""


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    bytes_per_second: int
    window_num: int
    window_size_s: int

    @property
    def enabled(self) -> bool:
        return self.bytes_per_second < UNLIMITED_BYTES_PER_SECOND

    def share(self, parts: int) -> QuotaSettings:
        """One of `parts` users' share, so that all of them together stay within the quota."""
        if not self.enabled or parts <= 1:
            return self
        return QuotaSettings(max(1, self.bytes_per_second // parts), self.window_num, self.window_size_s)


def copy_quota_settings(config: Any) -> QuotaSettings:
    return QuotaSettings(config[REMOTE_LOG_MANAGER_COPY_MAX_BYTES_PER_SECOND],
                         config[REMOTE_LOG_MANAGER_COPY_QUOTA_WINDOW_NUM],
                         config[REMOTE_LOG_MANAGER_COPY_QUOTA_WINDOW_SIZE_SECONDS])


def fetch_quota_settings(config: Any) -> QuotaSettings:
    return QuotaSettings(config[REMOTE_LOG_MANAGER_FETCH_MAX_BYTES_PER_SECOND],
                         config[REMOTE_LOG_MANAGER_FETCH_QUOTA_WINDOW_NUM],
                         config[REMOTE_LOG_MANAGER_FETCH_QUOTA_WINDOW_SIZE_SECONDS])


class RateQuota:
    """Kafka's `RLMQuotaManager`: a byte-rate bound, its throttle time, and waiting for it."""

    def __init__(self, settings: QuotaSettings, *, clock: Callable[[], float] = time.monotonic,
                 rate: SampledRate | None = None) -> None:
        self.settings = settings
        self.clock = clock
        #: the rate of this process, or one shared with others (storage/shared_quota.py)
        self.rate = rate if rate is not None else SampledRate(settings.window_num, settings.window_size_s)
        #: seconds each `acquire` waited, for the throttle-time metric (Kafka's
        #: remote-copy-throttle-time); only waits above zero are kept
        self.waits: list[float] = []
        #: bytes set aside for reads admitted and not done yet (`reserve`)
        self.reserved = 0

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def throttle_time(self, nbytes: int = 0) -> float:
        """Seconds to wait before the rate, with `nbytes` more, is within the quota; 0 when
        it is. Reservations count as recorded. For 0 bytes, Kafka's throttle time."""
        if not self.enabled:
            return 0.0
        now = self.clock()
        bound = self.settings.bytes_per_second
        rate = self.rate.measure(now, self.reserved + nbytes)
        if rate <= bound:
            return 0.0
        return (rate - bound) / bound * self.rate.window_size(now)

    def allows(self, nbytes: int) -> bool:
        """Whether `nbytes` more now keep the rate within the quota."""
        return self.throttle_time(nbytes) <= 0

    @contextlib.contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        """Count `nbytes` as recorded while the block runs: reads admitted and still to come.
        What they read is recorded as they read it."""
        self.reserved += nbytes
        self.rate.set_reserved(self.reserved)
        try:
            yield
        finally:
            self.reserved -= nbytes
            self.rate.set_reserved(self.reserved)

    def record(self, nbytes: int) -> None:
        if self.enabled:
            self.rate.record(nbytes, self.clock())

    async def acquire(self, nbytes: int) -> float:
        """Waits while the quota is exceeded, then records `nbytes`; returns the seconds waited."""
        waited = 0.0
        while (throttle := self.throttle_time()) > 0:
            # Re-checked after at most one window: what is recorded meanwhile counts too.
            delay = min(throttle, self.settings.window_size_s)
            started = self.clock()
            await asyncio.sleep(delay)
            waited += self.clock() - started
        self.record(nbytes)
        if waited > 0:
            self.waits.append(waited)
        return waited
