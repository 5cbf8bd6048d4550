"""A log that writes the same failure once per interval, with how many it left out.

A consumer retrying a remote read that keeps failing meets the same error thousands of
times a second; a line for each buries everything else in the log (the metrics still
count every one). The first failure of a kind is logged at once; those of the same kind
within `interval_s` after it are only counted, and the next line written for that kind
says how many there were: "... (and 2,849 more in the last 10 s)".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable

from cachetools import LRUCache

# One line per kind of failure per this many seconds.
LOG_INTERVAL_S = 10.0
# Kinds remembered at once (partitions x causes); the longest unseen is forgotten first.
MAX_KINDS = 10_000


class ThrottledLog:
    def __init__(self, logger: logging.Logger, *, interval_s: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, max_kinds: int = MAX_KINDS) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._clock = clock
        # kind -> [when its last line was written, how many were left out since]
        self._kinds: LRUCache[Hashable, list] = LRUCache(maxsize=max_kinds)

    def log(self, kind: Hashable, level: int, message: str, *args: object,
            exc_info: BaseException | None = None) -> None:
        """`logger.log(level, message, *args)` unless a line of `kind` went out less than
        `interval_s` ago; `kind` names the failure, e.g. (partition, error class)."""
        now = self._clock()
        seen = self._kinds.get(kind)
        if seen is not None and now - seen[0] < self.interval_s:
            seen[1] += 1
            return
        if seen is not None and seen[1]:
            message += " (and %s more in the last %.0f s)"
            args = (*args, f"{seen[1]:,}", now - seen[0])
        self._kinds[kind] = [now, 0]
        self.logger.log(level, message, *args, exc_info=exc_info, stacklevel=2)  # the caller's line
