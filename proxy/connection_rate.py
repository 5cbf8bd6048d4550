"""The rate at which new client connections are taken on (`max.connection.creation.rate`).

Kafka's brokers bound it per listener (KIP-612): the acceptor waits before accepting a
connection over the rate, so a client that reconnects in a loop (a login, a Fetch and a
reset, again and again) costs the broker no more than the rate, while the connections
already open go on unslowed. Here the kernel has accepted the connection already; the
proxy does the same by reading nothing from it and opening no broker connection for it
until its turn (`ConnectionRate.delay`).

A token bucket: up to one second's worth of connections (at least one) passes at once,
then one every 1/rate seconds; each connection over it is given the next free turn, so
a burst is spread out, not refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ("ConnectionRate",)


class ConnectionRate:
    """New connections per second; `delay` gives each its turn."""

    def __init__(self, per_second: float, clock: Callable[[], float] = time.monotonic) -> None:
        if per_second <= 0:
            raise ValueError(f"a connection rate must be above 0, not {per_second}")
        self.per_second = per_second
        self.burst = max(float(per_second), 1.0)
        self._clock = clock
        self._tokens = self.burst  # below 0: turns handed out ahead, still to come
        self._at = clock()

    def delay(self) -> float:
        """Seconds the connection opened now waits for its turn (0: none); its turn is taken."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_second)
        self._at = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.per_second
