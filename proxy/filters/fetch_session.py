"""What the proxy remembers of a client's fetch session (KIP-227) on one connection.

Sessions pass through: the broker keeps the session, the proxy forwards the client's
requests unchanged and replaces only the partitions the broker answers with
OFFSET_OUT_OF_RANGE. An incremental request omits a partition whose fetch position did
not move, and the broker keeps answering it out of range from the offset it cached; to
serve it the proxy needs that position. It has it when the partition's last answer came
from the remote tier without records (so the position did not move): the request that
carried it was decoded then. When it does not know the position, the client is told
FETCH_SESSION_ID_NOT_FOUND and starts a new session with a full fetch, as it does when a
broker evicts its session.
"""

from __future__ import annotations

from typing import Any

from tierproxy.protocol.fetch_wire import OUT_OF_RANGE, ScannedResponse


class FetchSessionPositions:
    """Positions of the partitions the remote tier answered without records, for the
    client's current fetch session on this connection."""

    __slots__ = ("session_id", "_positions")

    def __init__(self) -> None:
        self.session_id = 0
        self._positions: dict[tuple[Any, int], Any] = {}  # (topic key, partition) -> FetchPartition

    def request(self, session_id: int, epoch: int) -> None:
        """A request is about to be forwarded: a full fetch (epoch 0, or -1 without a
        session) or another session carries every position itself."""
        if epoch <= 0 or session_id != self.session_id:
            self._positions.clear()

    def response(self, scan: ScannedResponse) -> None:
        """The broker answered: its session id is the one the next request continues, and
        a partition it answered without OFFSET_OUT_OF_RANGE is local again."""
        if scan.error_code:
            self.session_id = 0
            self._positions.clear()
            return
        self.session_id = scan.session_id
        if self._positions:
            for key, partitions in scan.topics:
                for partition in partitions:
                    if partition.error_code != OUT_OF_RANGE:
                        self._positions.pop((key, partition.partition_index), None)

    def position(self, key: tuple[Any, int]) -> Any | None:
        return self._positions.get(key)

    def served(self, key: tuple[Any, int], fetch_partition: Any, moved: bool) -> None:
        """The remote tier answered a partition: if records went back, the client's next
        request carries its new position; if not, it may omit the partition."""
        if moved or not self.session_id:
            self._positions.pop(key, None)
        else:
            self._positions[key] = fetch_partition
