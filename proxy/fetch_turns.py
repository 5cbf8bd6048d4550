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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Hashable, Iterator, Sequence

from tierproxy.storage.quota import RateQuota

__all__ = ("FetchTurns",)


class FetchTurns:
    def __init__(self, quota: RateQuota, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.quota = quota
        self.clock = clock
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
            self._line[key] = now
        return False

    async def turn(self, key: Hashable, nbytes: int, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for `key`'s turn to read `nbytes`; False when it did not come."""
        if self.try_turn(key, nbytes):
            return True
        if timeout_s <= 0:
            return False
        deadline = self.clock() + timeout_s
        self._line[key] = None
        try:
            while True:
                now = self.clock()
                if self._may_go(key, nbytes, now):
                    self._went(key)
                    return True
                if now >= deadline:
                    return False
                changed = self._changed
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(deadline, self._next_look(key, nbytes, now)) - now)
        finally:
            if key in self._line:
                self._line[key] = self.clock()
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
                return True
            if away_since is None or now - away_since < self.grace_s:
                return False  # asking, or just between two Fetches: its turn first
        return True

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

    def _went(self, key: Hashable) -> None:
        self._line.pop(key, None)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _forget(self, now: float) -> None:
        for key, away_since in list(self._line.items()):
            if away_since is not None and now - away_since >= self.forget_s:
                del self._line[key]
