"""How many chunks a sequential reader keeps in flight: as many as hide the store's latency.

A chunk's ranged read waits `latency` for its first byte, then takes `transfer` for its
bytes. A reader that takes chunks as fast as they arrive finds the next one ready when a
new read starts every `transfer`: about latency / transfer reads waiting for their first
byte, and one arriving. So it keeps ceil(latency / transfer) + 1 chunks in flight.

Both are moving averages (EWMA) of what the store's reads into chunk buffers took
(`RemoteStorageManager.observe_range_reads`), the transfer as seconds per byte, so that a
segment's short last chunk counts at its size. Reads that run at once share the store's
bandwidth and each transfers more slowly: the estimate shrinks with the load it makes.
The count stays within [`minimum`, `maximum`] (`remote.log.read.ahead.chunks` and
`remote.log.read.ahead.max.chunks`); a minimum of 0 turns read-ahead off. The chunk cache
bounds it further (a prefetch runs only where its bytes can be reserved).
"""

from __future__ import annotations

import math

# Weight of the newest observation: the last ten or so reads count.
WEIGHT = 0.2


class ReadAhead:
    def __init__(self, minimum: int, maximum: int, *, weight: float = WEIGHT) -> None:
        if minimum < 0 or maximum < max(minimum, 1):
            raise ValueError(f"need 0 <= minimum and 1 <= maximum >= minimum, got {minimum}, {maximum}")
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        self.minimum = minimum
        self.maximum = maximum
        self._weight = weight
        self.latency_s: float | None = None
        self.seconds_per_byte: float | None = None

    def observe(self, first_byte_s: float, transfer_s: float, size: int) -> None:
        """One read of `size` bytes: `first_byte_s` until its first byte, `transfer_s` after."""
        if size <= 0 or first_byte_s < 0 or transfer_s < 0:
            return
        self.latency_s = self._average(self.latency_s, first_byte_s)
        self.seconds_per_byte = self._average(self.seconds_per_byte, transfer_s / size)

    def chunks(self, chunk_bytes: int) -> int:
        """Chunks of `chunk_bytes` to keep in flight ahead of a sequential reader."""
        if self.minimum == 0 or self.latency_s is None or self.seconds_per_byte is None:
            return self.minimum  # read-ahead off, or nothing observed yet: what is configured
        transfer_s = self.seconds_per_byte * chunk_bytes
        if self.latency_s <= 0:
            needed = 1
        elif transfer_s <= 0 or self.latency_s / transfer_s >= self.maximum:
            needed = self.maximum  # also a transfer too fast to time: the latency is all that counts
        else:
            needed = math.ceil(self.latency_s / transfer_s) + 1
        return max(self.minimum, min(self.maximum, needed))

    def _average(self, average: float | None, value: float) -> float:
        return value if average is None else average + self._weight * (value - average)
