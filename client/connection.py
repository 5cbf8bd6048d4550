"""One connection to one Kafka broker that sends decoded requests and returns decoded
responses. Used where tierproxy itself talks to a broker (its own ListOffsets, the
pipeline's raw fetches), not for relaying a client's frames.

Requests are pipelined: each waits in an in-flight deque of (correlation id, version,
future) and Kafka answers in order on a connection, so the head of the deque always
owns the next response. `close()` fails every pending future with the reason.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from typing import Any

from protocol.codecs import decode_response, encode_request
from protocol.errors import ProtocolError
from protocol.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from protocol.headers import parse_response_header, response_header_version


class KafkaConnectionError(ConnectionError):
    """The connection to the broker failed or was closed; pending requests fail with it."""


class KafkaConnection:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        client_id: str = "tierproxy",
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._client_id = client_id
        self._decoder = FrameDecoder(max_frame_bytes)
        self._correlation_ids = itertools.count(1)
        self._in_flight: collections.deque[tuple[int, int, int, asyncio.Future]] = collections.deque()
        self._closed_reason: BaseException | None = None
        self._read_task = asyncio.get_running_loop().create_task(self._read_loop())
        self.peer = writer.get_extra_info("peername")

    @classmethod
    async def open(cls, host: str, port: int, *, timeout: float = 10.0, **kwargs: Any) -> KafkaConnection:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except (OSError, asyncio.TimeoutError) as e:
            raise KafkaConnectionError(f"cannot connect to broker {host}:{port}: {e}") from e
        return cls(reader, writer, **kwargs)

    async def request(self, payload: Any, *, timeout: float | None = 30.0) -> Any:
        """Send a kio request object and return the decoded kio response."""
        if self._closed_reason is not None:
            raise KafkaConnectionError(f"connection to {self.peer} is closed") from self._closed_reason
        correlation_id = next(self._correlation_ids) & 0x7FFFFFFF
        future = asyncio.get_running_loop().create_future()
        self._in_flight.append((correlation_id, payload.__api_key__, payload.__version__, future))
        self._writer.writelines(encode_frame(encode_request(payload, correlation_id, self._client_id)))
        await self._writer.drain()
        return await asyncio.wait_for(future, timeout)

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._reader.read(256 * 1024)
                if not data:
                    self._decoder.at_eof()
                    raise KafkaConnectionError(f"broker {self.peer} closed the connection")
                for body in self._decoder.feed(data):
                    self._complete(body)
        except asyncio.CancelledError:
            self._fail_pending(KafkaConnectionError(f"connection to {self.peer} closed"))
            raise
        except (OSError, ProtocolError, KafkaConnectionError) as e:
            self._fail_pending(e)

    def _complete(self, body: memoryview) -> None:
        if not self._in_flight:
            raise KafkaConnectionError(f"broker {self.peer} sent a response nobody asked for")
        correlation_id, api_key, api_version, future = self._in_flight.popleft()
        header_version = response_header_version(api_key, api_version)
        received_id, offset = parse_response_header(body, header_version)
        if received_id != correlation_id:
            raise KafkaConnectionError(
                f"broker {self.peer} answered correlation id {received_id}, expected {correlation_id}"
            )
        if future.done():  # the caller timed out; the response is dropped
            return
        try:
            future.set_result(decode_response(api_key, api_version, body[offset:]))
        except ProtocolError as e:
            future.set_exception(e)

    def _fail_pending(self, reason: BaseException) -> None:
        self._closed_reason = reason
        while self._in_flight:
            *_, future = self._in_flight.popleft()
            if not future.done():
                error = KafkaConnectionError(f"request to {self.peer} failed: {reason}")
                error.__cause__ = reason
                future.set_exception(error)
        self._writer.close()

    async def close(self) -> None:
        self._read_task.cancel()
        try:
            await self._read_task
        except asyncio.CancelledError:
            pass
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass

    async def __aenter__(self) -> KafkaConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
