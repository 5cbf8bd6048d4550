"""What travels through a filter chain: the client's request, parsed at most once, and
the response on its way back to the client.

A request's payload is decoded by kio only when a filter asks for its ``body``, and
then once for the whole chain. A response is the broker's payload, buffers a filter
encoded, or a kio object: it is decoded only when a filter asks for its ``body``, and
encoded only when it was built as a kio object, so a response no filter changes goes
back as the broker's own bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tierproxy.protocol.codecs import decode_request, decode_response, encode_payload, encode_request
from tierproxy.protocol.errors import DecodeError

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from tierproxy.protocol.headers import RequestHeader

__all__ = ("ClientRequest", "InvalidRequest", "RefusedRequest", "Response")


class InvalidRequest(Exception):
    """The client's request does not parse. Like a broker, the proxy closes the
    connection (with one WARN line; the client's bytes are no proxy fault)."""


class RefusedRequest(Exception):
    """A request that gets no response must not reach the broker (`Filter.admit`): the
    proxy closes the connection with one WARN line saying why, counted as ``refused``."""


class ClientRequest:
    """A client's request: its header as peeked, its frame body (request header and
    payload, size prefix removed), and its payload as a kio object once asked for."""

    __slots__ = ("header", "frame_body", "answer", "_body", "_replaced", "_checked")

    def __init__(self, header: RequestHeader, frame_body: memoryview) -> None:
        self.header = header
        self.frame_body = frame_body
        self.answer: Response | None = None
        """The broker's answer, when the connection forwarded the request as it came before
        the chain had to handle it (`Filter.pass_through`); the chain's end returns it."""
        self._body: Any = None
        self._replaced = False
        self._checked = False

    @property
    def api_key(self) -> int:
        return self.header.api_key

    @property
    def api_version(self) -> int:
        """The version forwarded: the client's, or that of the body a filter put in."""
        return self._body.__version__ if self._replaced else self.header.api_version

    @property
    def payload(self) -> memoryview:
        """The client's payload (the frame body after the request header)."""
        return self.frame_body[self.header.header_size:]

    def structure_checked(self) -> None:
        """A filter has walked the whole payload, refusing any length or array count that
        does not fit it (the Fetch session check does): kio's decode then skips its own
        length walk (see `protocol.codecs.decode_request`)."""
        self._checked = True

    @property
    def body(self) -> Any:
        """The payload as a kio object, decoded on first use; InvalidRequest if it does
        not parse."""
        if self._body is None:
            header = self.header
            try:
                self._body = decode_request(header.api_key, header.api_version, self.payload, checked=self._checked)
            except DecodeError as e:
                raise InvalidRequest(str(e)) from None
        return self._body

    def replaced(self, body: Any) -> ClientRequest:
        """The request with another payload (the same API, any version), for the filters
        behind this one and the broker; the client's correlation id and client id stay."""
        request = ClientRequest(self.header, self.frame_body)
        request._body = body
        request._replaced = True
        return request

    def upstream_frame_body(self) -> Buffer:
        """What goes to the broker: the client's own bytes unless the payload was replaced."""
        if not self._replaced:
            return self.frame_body
        return encode_request(self._body, self.header.correlation_id, self.header.client_id)


class Response:
    """A response payload (no response header) on its way back through the chain."""

    __slots__ = ("api_key", "api_version", "_parts", "_body", "tagged_fields")

    def __init__(self, api_key: int, api_version: int, *, parts: Sequence[Buffer] | None = None, body: Any = None,
                 tagged_fields: Buffer | None = None) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self._parts = parts
        self._body = body
        self.tagged_fields = tagged_fields
        """The payload's own top-level tagged-field section, which ends it, when whoever
        encoded the payload knows it (the Fetch filter's scan); None when unknown."""

    @classmethod
    def encoded(cls, api_key: int, api_version: int, parts: Sequence[Buffer], *,
                tagged_fields: Buffer | None = None) -> Response:
        """A payload as buffers, written to the client with ``writelines``, never joined."""
        return cls(api_key, api_version, parts=parts, tagged_fields=tagged_fields)

    @classmethod
    def of(cls, body: Any) -> Response:
        """A kio response object, encoded when it goes to the client."""
        return cls(body.__api_key__, body.__version__, body=body)

    @property
    def parts(self) -> Sequence[Buffer]:
        if self._parts is None:
            self._parts = [encode_payload(self._body)]
        return self._parts

    @property
    def payload(self) -> Buffer:
        """The payload as one buffer (joined only when it is in several parts)."""
        parts = self.parts
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @property
    def body(self) -> Any:
        """The payload as a kio object, decoded on first use; DecodeError if the broker's
        bytes do not parse."""
        if self._body is None:
            self._body = decode_response(self.api_key, self.api_version, self.payload)
        return self._body

    def with_tagged_fields(self, section: bytes) -> Response:
        """This payload with its top-level tagged-field section (`tagged_fields`, known)
        replaced by `section`; every other buffer is kept as it is."""
        old = self.tagged_fields
        if old is None:
            raise ValueError("the payload's tagged-field section is not known")
        parts = list(self.parts)
        cut = memoryview(old).nbytes
        while cut:
            last = memoryview(parts.pop()).cast("B")
            if len(last) > cut:
                parts.append(last[:len(last) - cut])
                cut = 0
            else:
                cut -= len(last)
        parts.append(section)
        return Response.encoded(self.api_key, self.api_version, parts, tagged_fields=section)
