"""Exponential retry backoff with jitter, as Kafka's `org.apache.kafka.common.utils.ExponentialBackoff`.

    backoff(attempts) = min(max, initial * multiplier ** attempts) * uniform(1 - jitter, 1 + jitter),
                        never above max

with `attempts` counted from 0 (the delay before the first retry is about `initial`). When
max <= initial the backoff is a constant `max`, without jitter, as in Kafka. tierproxy's
retries (S3 requests, failed tiering passes) are driven by Kafka's
`remote.log.manager.task.retry.backoff.ms`, `.retry.backoff.max.ms` and `.retry.jitter`.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from tierproxy.config import Settings, REMOTE_LOG_MANAGER_TASK_RETRY_BACKOFF_MAX_MS, REMOTE_LOG_MANAGER_TASK_RETRY_BACKOFF_MS, REMOTE_LOG_MANAGER_TASK_RETRY_JITTER

__all__ = ("ExponentialBackoff", "read_deadline", "read_time_left", "retry_fits")

# When the fetch waiting for a remote read gives up (remote.fetch.max.wait.ms): a store
# retry that would end later is not made, so the read fails while the fetch can still
# answer the partition with the error, and the next fetch tries the store again.
_READ_DEADLINE: ContextVar[float | None] = ContextVar("tierproxy_read_deadline", default=None)


@contextlib.contextmanager
def read_deadline(seconds: float | None) -> Iterator[None]:
    """Retries of the store inside this block (and the tasks it starts) end within `seconds`."""
    token = _READ_DEADLINE.set(None if seconds is None else time.monotonic() + seconds)
    try:
        yield
    finally:
        _READ_DEADLINE.reset(token)


def read_time_left() -> float | None:
    """Seconds left of the current read deadline (None: no deadline)."""
    deadline = _READ_DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()


def retry_fits(delay_s: float) -> bool:
    """Whether waiting `delay_s` before a retry still ends inside the current read deadline."""
    deadline = _READ_DEADLINE.get()
    return deadline is None or time.monotonic() + delay_s < deadline


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    initial_ms: float
    max_ms: float
    jitter: float
    multiplier: float = 2

    def __post_init__(self) -> None:
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"retry jitter must be in [0, 1], got {self.jitter}")
        if not 0 <= self.initial_ms <= self.max_ms:
            raise ValueError(f"retry backoff needs 0 <= initial <= max, got {self.initial_ms} and {self.max_ms}")
        if self.multiplier <= 1:
            raise ValueError(f"retry backoff multiplier must be above 1, got {self.multiplier}")

    @classmethod
    def from_config(cls, config: Settings) -> ExponentialBackoff:
        """The backoff of `remote.log.manager.task.retry.backoff.ms`, `...backoff.max.ms` and `...jitter`."""
        return cls(
            config[REMOTE_LOG_MANAGER_TASK_RETRY_BACKOFF_MS],
            config[REMOTE_LOG_MANAGER_TASK_RETRY_BACKOFF_MAX_MS],
            config[REMOTE_LOG_MANAGER_TASK_RETRY_JITTER],
        )

    def backoff_ms(self, attempts: int, uniform: Callable[[float, float], float] = random.uniform) -> float:
        """Milliseconds to wait before retry number `attempts` (0 for the first retry)."""
        if self.max_ms <= self.initial_ms:
            return self.max_ms
        # The exponent stops once the term is past max: no float overflow on long outages.
        cap = math.ceil(math.log(self.max_ms / self.initial_ms, self.multiplier)) + 1 if self.initial_ms > 0 else 0
        term = min(self.max_ms, self.initial_ms * self.multiplier ** min(attempts, cap))
        factor = uniform(1.0 - self.jitter, 1.0 + self.jitter) if self.jitter > 0 else 1.0
        return min(term * factor, self.max_ms)
