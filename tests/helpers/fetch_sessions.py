"""Raw Fetch v12 requests that play a session-using client (KIP-227: a full fetch with
epoch 0, then incremental fetches naming only the partitions whose position moved), what
their answers hold, and which of them the Fetch filter's chain handled."""

from __future__ import annotations

from kio.schema.fetch.v12 import request as fetch
from kio.static.primitive import i8, i32, i64

from tierproxy.protocol.requests import milliseconds
from tierproxy.proxy.filters.fetch import FetchFilter


def session_fetch(topic: str, positions: dict[int, int], *, session_id: int, epoch: int,
                  max_bytes: int = 1 << 20, partition_max_bytes: dict[int, int] | None = None) -> fetch.FetchRequest:
    """`partition_max_bytes`: per partition, 64 KiB when not given."""
    partition_max_bytes = partition_max_bytes or {}
    return fetch.FetchRequest(
        max_wait=milliseconds(100), min_bytes=i32(1), max_bytes=i32(max_bytes), isolation_level=i8(0),
        session_id=i32(session_id), session_epoch=i32(epoch),
        topics=(fetch.FetchTopic(topic=topic, partitions=tuple(
            fetch.FetchPartition(partition=i32(p), fetch_offset=i64(o),
                                 partition_max_bytes=i32(partition_max_bytes.get(p, 64 * 1024)))
            for p, o in positions.items())),) if positions else (),
        forgotten_topics_data=(),
    )


def answered(response) -> dict[int, object]:
    """The partitions of a Fetch response of one topic, by index."""
    return {p.partition_index: p for topic in response.responses for p in topic.partitions}


def chain_handled(monkeypatch) -> list[int]:
    """The correlation ids of the Fetch requests the Fetch filter's chain handles from now
    on (the proxy in this process): one that crossed at the tail (`Filter.pass_through`)
    is not among them."""
    calls: list[int] = []
    original = FetchFilter.handle

    async def handle(self, ctx, client_request, call_next):
        calls.append(client_request.header.correlation_id)
        return await original(self, ctx, client_request, call_next)

    monkeypatch.setattr(FetchFilter, "handle", handle)
    return calls
