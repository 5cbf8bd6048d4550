"""Where a client connection stands in SASL authentication, as the broker sees it.

On a SASL listener a broker accepts only ApiVersions, SaslHandshake and
SaslAuthenticate until authentication is complete, closes the connection on any
other request, and reads frames of at most ``sasl.server.max.receive.size`` until
then (SaslServerAuthenticator). The proxy applies the same rules before it forwards
anything, so an unauthenticated client can neither make it hold large frames nor
have a request answered by a filter.

The connection asks its gate (`authentication_gate`: a SaslGate, or an OpenGate on
listeners without SASL) about each request and the frame bound; the gate names the
responses it wants to see (SaslAuthenticate's) by the observer it returns, so the
connection's response path knows no API.

The proxy never sees the SASL exchange's outcome in clear, only SaslAuthenticate
error codes: authentication is complete after as many successful rounds as the
mechanism takes (PLAIN and OAUTHBEARER one, SCRAM two). A mechanism whose number of
rounds is not fixed (GSSAPI) counts as authenticated after its first successful
round; the broker still closes the connection if it was not.
"""

from __future__ import annotations

import functools
import struct

from collections.abc import Callable

from tierproxy.config import SASL_SERVER_MAX_RECEIVE_SIZE, SECURITY_PROTOCOL, SOCKET_REQUEST_MAX_BYTES, Config
from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.headers import RequestHeader, parse_response_header, response_header_version

from .metrics import api_name

__all__ = ("AuthenticationGate", "OpenGate", "ResponseObserver", "SaslGate", "UnauthenticatedRequest",
           "authentication_gate")

_INT16 = struct.Struct(">h")
_ROUNDS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}
_ALLOWED = frozenset((ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE))

ResponseObserver = Callable[[memoryview], None]
"""Sees the response frame body (response header included) of a request it tracks,
before the client does; raises ProtocolError if the broker's bytes do not parse."""


class UnauthenticatedRequest(Exception):
    """A request other than ApiVersions or SASL before authentication completed."""


class OpenGate:
    """A listener without SASL: every request passes, in frames up to
    ``socket.request.max.bytes``."""

    __slots__ = ("max_frame_bytes",)

    authenticated = True

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes

    def check_request(self, header: RequestHeader, body: memoryview) -> ResponseObserver | None:
        return None


class SaslGate:
    """The authentication state of one client connection on a SASL listener."""

    __slots__ = ("mechanism", "rounds", "authenticated", "_max_receive_size", "_max_frame_bytes")

    def __init__(self, max_receive_size: int, max_frame_bytes: int) -> None:
        self.mechanism = ""
        self.rounds = 0
        self.authenticated = False
        self._max_receive_size = max_receive_size
        self._max_frame_bytes = max_frame_bytes

    @property
    def max_frame_bytes(self) -> int:
        """``sasl.server.max.receive.size`` until authenticated, then ``socket.request.max.bytes``."""
        return self._max_frame_bytes if self.authenticated else self._max_receive_size

    def check_request(self, header: RequestHeader, body: memoryview) -> ResponseObserver | None:
        """Refuse what the broker refuses before authentication; note the mechanism. For a
        SaslAuthenticate, the observer that counts its response."""
        if self.authenticated:
            return None
        if header.api_key not in _ALLOWED:
            raise UnauthenticatedRequest(
                f"{api_name(header.api_key)} request before SASL authentication completed")
        if header.api_key == ApiKey.SASL_HANDSHAKE:
            self.mechanism = _handshake_mechanism(body, header.header_size)
            self.rounds = 0
        elif header.api_key == ApiKey.SASL_AUTHENTICATE:
            return functools.partial(self._on_authenticate_response, header.api_version)
        return None

    def _on_authenticate_response(self, api_version: int, body: memoryview) -> None:
        """Count a successful SaslAuthenticate round."""
        if self.authenticated:
            return
        header_version = response_header_version(ApiKey.SASL_AUTHENTICATE, api_version)
        if header_version is None:
            raise DecodeError(f"no response header version for SASL_AUTHENTICATE v{api_version}")
        _, offset = parse_response_header(body, header_version)
        if offset + 2 > len(body):
            raise DecodeError("SaslAuthenticate response ends before its error code")
        if _INT16.unpack_from(body, offset)[0] != 0:
            return  # the broker closes the connection after a failed round
        self.rounds += 1
        if self.rounds >= _ROUNDS.get(self.mechanism, 1):
            self.authenticated = True


AuthenticationGate = OpenGate | SaslGate


def authentication_gate(config: Config) -> AuthenticationGate:
    """The gate of a new client connection: SASL rules on a SASL listener, else none."""
    if config[SECURITY_PROTOCOL].startswith("SASL_"):
        return SaslGate(config[SASL_SERVER_MAX_RECEIVE_SIZE], config[SOCKET_REQUEST_MAX_BYTES])
    return OpenGate(config[SOCKET_REQUEST_MAX_BYTES])


def _handshake_mechanism(body: memoryview, pos: int) -> str:
    # SaslHandshake v0-v1 (not flexible): mechanism as an int16-length string.
    if pos + 2 > len(body):
        raise DecodeError("SaslHandshake request ends before its mechanism")
    (length,) = _INT16.unpack_from(body, pos)
    if length < 0 or pos + 2 + length > len(body):
        raise DecodeError(f"SaslHandshake mechanism of {length} bytes does not fit the request")
    return bytes(body[pos + 2: pos + 2 + length]).decode("utf-8", "replace").upper()
