"""Responses go back to a client in the order of its requests.

Kafka clients match a response to the oldest in-flight request of the connection, so
a response the proxy finishes late (an intercepted Fetch waiting on remote storage)
must hold back every younger one. Like kroxylicious' ResponseOrderer: each request
that expects a response reserves a slot at the tail of a deque; a slot is filled
when its response is ready; the filled slots at the head are written, in order.
A response whose slot is already at the head (the usual pass-through case) is
written straight away without being stored. A response may carry the leases on the
chunks it sends from (`paced.Releasable`): they go with it to `write`, or are given
back when the connection closes before it was written.
"""

from __future__ import annotations

import collections

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from .paced import Releasable

__all__ = ("ResponseOrderer", "ResponseSlot")


class ResponseSlot:
    """The place of one response in the connection's response order."""

    __slots__ = ("api_key", "correlation_id", "parts", "leases")

    def __init__(self, api_key: int, correlation_id: int) -> None:
        self.api_key = api_key
        self.correlation_id = correlation_id
        self.parts: Sequence[Buffer] | None = None
        self.leases: Releasable | None = None

    def __repr__(self) -> str:
        state = "ready" if self.parts is not None else "waiting"
        return f"ResponseSlot(api_key={self.api_key}, correlation_id={self.correlation_id}, {state})"


class ResponseOrderer:
    """Holds finished responses until every older one went out.

    ``write`` receives the parts of one whole response frame (size prefix included) and
    its leases, and must not fail; it queues them on the connection's ``PacedWriter``.
    """

    __slots__ = ("_slots", "_write")

    def __init__(self, write: Callable[[Sequence[Buffer], Releasable | None], None]) -> None:
        self._write = write
        self._slots: collections.deque[ResponseSlot] = collections.deque()

    def __len__(self) -> int:
        """Responses owed to the client."""
        return len(self._slots)

    def reserve(self, api_key: int, correlation_id: int) -> ResponseSlot:
        slot = ResponseSlot(api_key, correlation_id)
        self._slots.append(slot)
        return slot

    def complete(self, slot: ResponseSlot, parts: Sequence[Buffer], leases: Releasable | None = None) -> None:
        """The response of ``slot`` is ready; write it and any ready ones behind it."""
        slots = self._slots
        if slots and slots[0] is slot:
            slots.popleft()
            self._write(parts, leases)
            self._flush()
            return
        if slot.parts is not None:
            raise RuntimeError(f"{slot!r} completed twice")
        slot.parts = parts
        slot.leases = leases

    def _flush(self) -> None:
        slots = self._slots
        while slots and (parts := slots[0].parts) is not None:
            slot = slots.popleft()
            leases, slot.parts, slot.leases = slot.leases, None, None
            self._write(parts, leases)

    def clear(self) -> None:
        """The connection closed: nothing more is owed; the leases of responses that
        were ready but not written go back."""
        slots, self._slots = self._slots, collections.deque()
        for slot in slots:
            if slot.leases is not None:
                slot.leases.release()
                slot.leases = None
