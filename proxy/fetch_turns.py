"""Turns at the remote fetch quota (KIP-956): a Fetch reads remote partitions when the quota
has room for what it may read, and while the quota holds reads back, connections read in
the order they were first held back, so that none waits while others are served.

Kafka reads when the rate is within the quota and records what it read, so the rate ends
one read above the quota at most; a read there is about a fetch's bytes. The proxy reads
whole chunks (up to `remote.log.chunk.size.bytes`, 4 MiB by default), so a turn goes when
the quota has room for the chunks it may read (`turn_bytes`), set aside until its reads are
done: the rate then stays within the quota, not a chunk above it per turn. Room for at most
a tenth of the quota's window (and one sample's worth, all there is after an idle spell) is
asked: a turn that may read more goes with that room, so the rate passes the quota by at
most its reads beyond that tenth, and turns waiting for room leave at most a tenth of the
quota unused.

Kafka answers a partition over the quota with empty records, and whichever fetch comes
first once the rate falls back reads: with many consumers, one can be passed over window
after window. Here a connection held back takes a place in line; when the quota has room,
the first in line that is asking reads, then the next. A place is kept while its
connection is between Fetches: it holds back those behind it for at most `grace_s` (one
quota sample, `window.size.seconds`), and is given up after a whole quota window
(`window.num` x `window.size.seconds`) away. With nobody in line, whoever asks reads as
soon as the quota has room.

With several workers (proxy/workers.py) the quota's rate and the line are shared
(storage/shared_quota.py): a connection held back takes a ticket from one counter of all
the workers, and goes only when no connection with an earlier ticket, in any worker, holds
it back. Another worker cannot wake a connection in line, so it looks again every
`SHARED_LOOK_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Callable, Hashable, Iterator, Sequence

from tierproxy.storage.quota import RateQuota
from tierproxy.storage.shared_quota import SharedQuotaFile

__all__ = ("FetchTurns",)


class FetchTurns:
    #: how often a connection in line looks again when the line is shared with other workers,
    #: which cannot wake it
    SHARED_LOOK_S = 0.05

    def __init__(self, quota: RateQuota, *, clock: Callable[[], float] = time.monotonic,
                 shared: SharedQuotaFile | None = None) -> None:
        self.quota = quota
        self.clock = clock
        #: the line of all the workers (with the quota's rate): tickets say who came first
        self.shared = shared
        self._tickets: dict[Hashable, int] = {}
        self.grace_s = float(quota.settings.window_size_s)
        self.forget_s = float(quota.settings.window_num * quota.settings.window_size_s)
        #: connection -> since when it is away (between Fetches), None while it asks; in
        #: the order they were first held back
        self._line: dict[Hashable, float | None] = {}
        self._changed = asyncio.Event()

    def turn_bytes(self, partition_max_bytes: Sequence[int], budget: int, chunk_size: int) -> int:
        """What a turn may read from the store: each partition's share of `budget` in whole
        chunks, in all at most the budget in whole chunks; room for at most a tenth of the
        quota's window, and one sample's worth, is asked (see above)."""

        def chunks(nbytes: int) -> int:
            return -(-max(nbytes, 1) // chunk_size) * chunk_size

        wanted = min(sum(chunks(min(size, budget)) for size in partition_max_bytes), chunks(budget))
        settings = self.quota.settings
        sample = settings.bytes_per_second * settings.window_size_s  # all that fits after an idle spell
        return min(wanted, sample, sample * settings.window_num // 10)

    def waiting(self) -> int:
        """Connections in line."""
        return len(self._line)

    def try_turn(self, key: Hashable, nbytes: int) -> bool:
        """Whether `key` may read `nbytes` now; if not, it keeps its place in line (or
        takes the last)."""
        if not self.quota.enabled:
            return True
        now = self.clock()
        if self._may_go(key, nbytes, now):
            self._went(key)
            return True
        if self._line.get(key, now) is not None:  # unless it asks in another Fetch right now
            self._join(key, now)
        return False

    async def turn(self, key: Hashable, nbytes: int, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for `key`'s turn to read `nbytes`; False when it did not come."""
        if self.try_turn(key, nbytes):
            return True
        if timeout_s <= 0:
            return False
        deadline = self.clock() + timeout_s
        self._join(key, None)
        try:
            while True:
                now = self.clock()
                if self._may_go(key, nbytes, now):
                    self._went(key)
                    return True
                if now >= deadline:
                    return False
                changed = self._changed
                look = min(deadline, self._next_look(key, nbytes, now))
                if self.shared is not None:
                    look = min(look, now + self.SHARED_LOOK_S)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), look - now)
        finally:
            if key in self._line:
                self._join(key, self.clock())
                self._notify()

    @contextlib.contextmanager
    def reading(self, nbytes: int) -> Iterator[None]:
        """A turn's reads: `nbytes` set aside in the quota until they are done (what they
        read is recorded as the store reads it), then those in line look again."""
        if not self.quota.enabled:
            yield
            return
        try:
            with self.quota.reserve(nbytes):
                yield
        finally:
            self._notify()

    def _may_go(self, key: Hashable, nbytes: int, now: float) -> bool:
        self._forget(now)
        if not self.quota.allows(nbytes):
            return False
        for ahead, away_since in self._line.items():
            if ahead == key:
                break
            if away_since is None or now - away_since < self.grace_s:
                return False  # asking, or just between two Fetches: its turn first
        # and the same in the other workers' lines, for whoever came before it
        return self.shared is None or not self.shared.ahead_elsewhere(self._tickets.get(key, sys.maxsize), now)

    def _next_look(self, key: Hashable, nbytes: int, now: float) -> float:
        """When the quota or the line may let `key` go, unless someone ahead goes first."""
        if not self.quota.allows(nbytes):  # looked at again each sample: an old one may expire first
            return now + min(self.quota.throttle_time(nbytes), self.grace_s)
        graces = []
        for ahead, away_since in self._line.items():
            if ahead == key:
                break
            if away_since is not None:
                graces.append(away_since + self.grace_s)
        return min(graces, default=float("inf"))

    def _join(self, key: Hashable, away_since: float | None) -> None:
        """`key` in line, asking (None) or away since then; a newcomer takes the next ticket."""
        if key not in self._line:
            self._tickets[key] = self.shared.next_ticket() if self.shared is not None else 0
        self._line[key] = away_since
        self._publish()

    def _went(self, key: Hashable) -> None:
        if key in self._line:
            del self._line[key], self._tickets[key]
            self._publish()
        self._notify()

    def _publish(self) -> None:
        """This worker's line, as the other workers see it: each ticket, and until when it
        holds back those behind it."""
        if self.shared is not None:
            self.shared.set_line([(self._tickets[key], math.inf if away_since is None else away_since + self.grace_s)
                                  for key, away_since in self._line.items()])

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _forget(self, now: float) -> None:
        gone = [key for key, away_since in self._line.items()
                if away_since is not None and now - away_since >= self.forget_s]
        for key in gone:
            del self._line[key], self._tickets[key]
        if gone:
            self._publish()
