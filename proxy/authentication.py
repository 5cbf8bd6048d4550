"""Where a client connection stands in SASL authentication, as the broker sees it.

On a SASL listener a broker accepts only ApiVersions, SaslHandshake and
SaslAuthenticate until authentication is complete, closes the connection on any
other request, and reads frames of at most ``sasl.server.max.receive.size`` until
then (SaslServerAuthenticator). The proxy applies the same bound before it forwards
anything, so an unauthenticated client cannot make it hold large frames.

Whether the upstream listener wants SASL does not follow from ``security.protocol``
(the setting of the proxy's own connections): the proxy learns it (`UpstreamListener`).

- ``security.protocol`` SASL_*: every connection gets a SaslGate, the broker's rules
  (only SASL requests and small frames until the login completed; no filter runs but
  ApiVersions', so that the versions the client keeps are the proxy's).
- Otherwise a LearningGate. The bound holds until the connection is known not to need
  a login: the listener is known to take requests without one, or the broker answered
  this connection a request other than ApiVersions and SASL (a SASL listener would have
  closed it instead). A SaslHandshake hands the connection to a SaslGate's rules.
- The listener is known from the proxy's own Metadata request without a login, at
  start-up (answered: no SASL; refused after ApiVersions: SASL), from connections the
  broker answered, and again after a broker closed a connection that it had answered
  nothing but ApiVersions, as a SASL listener does to a client that does not log in
  (then the proxy asks again before it trusts the listener).

The connection asks its gate about each request and the frame bound, and tells it
which responses arrived; the gate names the SaslAuthenticate responses it wants to
see by the observer it returns, so the connection's response path knows no API.

The proxy never sees the SASL exchange's outcome in clear, only SaslAuthenticate
error codes: authentication is complete after as many successful rounds as the
mechanism takes (PLAIN and OAUTHBEARER one, SCRAM two). A mechanism whose number of
rounds is not fixed (GSSAPI) counts as authenticated after its first successful
round; the broker still closes the connection if it was not.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
import time

from collections.abc import Callable, Coroutine
from typing import Any

from tierproxy.config import (
    BROKER_CONNECTION_SETUP_TIMEOUT_MS,
    SASL_SERVER_MAX_RECEIVE_SIZE,
    SECURITY_PROTOCOL,
    SOCKET_REQUEST_MAX_BYTES,
    Config,
)
from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.headers import RequestHeader, parse_response_header, response_header_version

from .metrics import api_name

__all__ = ("AuthenticationGate", "LearningGate", "ResponseObserver", "SaslGate", "UnauthenticatedRequest",
           "UpstreamListener")

log = logging.getLogger(__name__)

_INT16 = struct.Struct(">h")
_ROUNDS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}
_ALLOWED = frozenset((ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE))

ResponseObserver = Callable[[memoryview], None]
"""Sees the response frame body (response header included) of a request it tracks,
before the client does; raises ProtocolError if the broker's bytes do not parse."""


class UnauthenticatedRequest(Exception):
    """A request other than ApiVersions or SASL before authentication completed."""


# The bound a frame is held to, named in the log line of a connection closed for it.
PRE_AUTHENTICATION_BOUND = f"before authentication, {SASL_SERVER_MAX_RECEIVE_SIZE.name}"
REQUEST_BOUND = SOCKET_REQUEST_MAX_BYTES.name


class SaslGate:
    """The authentication state of one client connection on a SASL listener."""

    __slots__ = ("mechanism", "rounds", "authenticated", "_max_receive_size", "_max_frame_bytes")

    learning = False

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

    @property
    def bound(self) -> str:
        return REQUEST_BOUND if self.authenticated else PRE_AUTHENTICATION_BOUND

    def filtered(self, api_key: int) -> bool:
        """Whether the proxy's filters may see a request of `api_key`: all once authenticated;
        before, only ApiVersions, whose answer a SASL client asks before it logs in and then
        keeps for the connection (so it must be the proxy's ranges, not the broker's)."""
        return self.authenticated or api_key == ApiKey.API_VERSIONS

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

    def answered(self, api_key: int) -> bool:
        return False  # the observers of SaslAuthenticate responses lift the bound

    def broker_closed(self) -> None:
        pass

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


class LearningGate:
    """A connection whose need for SASL the proxy learns from the client and the broker.

    Starts open when the listener is known to take requests without SASL, else bounded
    by ``sasl.server.max.receive.size``; every request passes to the broker, which
    refuses what a SASL listener refuses. The broker answering a request other than
    ApiVersions and SASL settles it open; a SaslHandshake hands it to SaslGate's rules.
    """

    __slots__ = ("_listener", "_max_receive_size", "_max_frame_bytes", "_open", "_sasl", "_asked", "learning")

    def __init__(self, listener: UpstreamListener, max_receive_size: int, max_frame_bytes: int, *,
                 open_: bool) -> None:
        self._listener = listener
        self._max_receive_size = max_receive_size
        self._max_frame_bytes = max_frame_bytes
        self._open = open_
        self._sasl: SaslGate | None = None
        self._asked = False  # a request other than ApiVersions and SASL went to the broker
        self.learning = True  # until a response settles it, or the client starts SASL

    @property
    def authenticated(self) -> bool:
        """Whether filters may see the requests: not while a SASL login is under way."""
        return self._sasl is None or self._sasl.authenticated

    @property
    def max_frame_bytes(self) -> int:
        if self._sasl is not None:
            return self._sasl.max_frame_bytes
        return self._max_frame_bytes if self._open else self._max_receive_size

    @property
    def bound(self) -> str:
        return self._sasl.bound if self._sasl is not None else REQUEST_BOUND if self._open else PRE_AUTHENTICATION_BOUND

    def filtered(self, api_key: int) -> bool:
        """As SaslGate's once the client started a login; every request otherwise."""
        return self._sasl is None or self._sasl.filtered(api_key)

    def check_request(self, header: RequestHeader, body: memoryview) -> ResponseObserver | None:
        if self._sasl is not None:
            return self._sasl.check_request(header, body)
        if header.api_key == ApiKey.SASL_HANDSHAKE and self.learning:
            # The client logs in: the broker's rules until it is done, whatever was believed.
            self._sasl = SaslGate(self._max_receive_size, self._max_frame_bytes)
            self.learning = False
            return self._sasl.check_request(header, body)
        if header.api_key not in _ALLOWED:
            self._asked = True
        return None

    def answered(self, api_key: int) -> bool:
        """A response from the broker arrived; True when it lifted the bound."""
        if api_key in _ALLOWED:
            return False
        # A SASL listener closes the connection instead of answering before a login.
        self.learning = False
        self._listener.learned(needs_sasl=False, how="a broker answered a request without a login")
        lifted = not self._open
        self._open = True
        return lifted

    def broker_closed(self) -> None:
        """The broker closed the connection: before answering a request it was asked other
        than ApiVersions and SASL, as a SASL listener does to a client that skips the login."""
        if self.learning and self._asked:
            self._listener.refused()


AuthenticationGate = SaslGate | LearningGate

# A new look at the listener is not taken more often than this.
PROBE_INTERVAL_S = 5.0


class UpstreamListener:
    """What the proxy knows of whether the brokers' listener wants SASL, and the gates of
    new client connections that follow from it.

    ``needs_sasl`` is True, False or None (not known). ``probe`` asks the brokers (a
    Metadata request without a login) and reports with ``learned``; it runs when a
    connection starts while nothing is known, at most once per PROBE_INTERVAL_S.
    """

    def __init__(self, config: Config, probe: Callable[[], Coroutine[Any, Any, object]] | None = None) -> None:
        self.configured = config[SECURITY_PROTOCOL].startswith("SASL_")
        self.needs_sasl: bool | None = True if self.configured else None
        self._max_receive_size: int = config[SASL_SERVER_MAX_RECEIVE_SIZE]
        self._max_frame_bytes: int = config[SOCKET_REQUEST_MAX_BYTES]
        self._probe = probe
        self._probe_timeout_s = config[BROKER_CONNECTION_SETUP_TIMEOUT_MS] / 1000
        self._probing: asyncio.Task[object] | None = None
        self._probed_at = -PROBE_INTERVAL_S

    def gate(self) -> AuthenticationGate:
        """The gate of a new client connection."""
        if self.configured:
            return SaslGate(self._max_receive_size, self._max_frame_bytes)
        return LearningGate(self, self._max_receive_size, self._max_frame_bytes, open_=self.needs_sasl is False)

    def learned(self, *, needs_sasl: bool, how: str) -> None:
        if self.configured or self.needs_sasl is needs_sasl:
            return
        self.needs_sasl = needs_sasl
        if needs_sasl:
            log.info("the brokers' listener wants SASL (%s): frames before a client's login are held to %s=%d",
                     how, SASL_SERVER_MAX_RECEIVE_SIZE.name, self._max_receive_size)
        else:
            log.info("the brokers' listener takes requests without SASL (%s): frames up to %s=%d",
                     how, SOCKET_REQUEST_MAX_BYTES.name, self._max_frame_bytes)

    def refused(self) -> None:
        """A broker closed a connection as a SASL listener does to a client without a login."""
        if self.needs_sasl is False:
            log.warning("a broker closed a client's connection before answering its first request: its listener "
                        "may want SASL now; frames before a login are held to %s until the proxy knows",
                        SASL_SERVER_MAX_RECEIVE_SIZE.name)
            self.needs_sasl = None
            self._probed_at = -PROBE_INTERVAL_S

    async def settle(self) -> None:
        """Ask the brokers when nothing is known (once at a time, not too often); a new
        connection waits for the answer (at most broker.connection.setup.timeout.ms)."""
        if self.needs_sasl is not None or self._probe is None:
            return
        if self._probing is None or self._probing.done():
            now = time.monotonic()
            if now - self._probed_at < PROBE_INTERVAL_S:
                return
            self._probed_at = now
            self._probing = asyncio.get_running_loop().create_task(self._probe())
        try:
            await asyncio.wait_for(asyncio.shield(self._probing), self._probe_timeout_s)
        except Exception:  # noqa: BLE001 - the connection starts bounded; the probe logs its failures
            pass

    async def close(self) -> None:
        if self._probing is not None:
            self._probing.cancel()
            await asyncio.gather(self._probing, return_exceptions=True)


def _handshake_mechanism(body: memoryview, pos: int) -> str:
    # SaslHandshake v0-v1 (not flexible): mechanism as an int16-length string.
    if pos + 2 > len(body):
        raise DecodeError("SaslHandshake request ends before its mechanism")
    (length,) = _INT16.unpack_from(body, pos)
    if length < 0 or pos + 2 + length > len(body):
        raise DecodeError(f"SaslHandshake mechanism of {length} bytes does not fit the request")
    return bytes(body[pos + 2: pos + 2 + length]).decode("utf-8", "replace").upper()
