"""One connection to one Kafka broker that sends decoded requests and returns decoded
responses. Used where tierproxy itself talks to a broker (the pipeline, `status`, the
proxy's broker discovery), not for relaying a client's frames.

`open()` does what a Kafka client does before its first request: TLS when the security
protocol says so, ApiVersions (so every later request is checked against the versions
this broker supports, with an error that names both), then the SASL exchange
(SaslHandshake v1, SaslAuthenticate). A failure names the configuration key to fix.

Requests are pipelined: each waits in an in-flight deque of (correlation id, version,
future) and Kafka answers in order on a connection, so the head of the deque always
owns the next response. `close()` fails every pending future with the reason.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import ssl
from typing import Any

from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from tierproxy.protocol.apis import ApiKey, ErrorCode, error_name
from tierproxy.protocol.codecs import decode_response, encode_request
from tierproxy.protocol.errors import ProtocolError
from tierproxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from tierproxy.protocol.headers import parse_response_header, response_header_version

from .sasl import SaslError, mechanism
from .security import PLAINTEXT, Security

CLIENT_SOFTWARE_NAME = "tierproxy"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tierproxy")
    except PackageNotFoundError:
        return "0"


class KafkaConnectionError(ConnectionError):
    """The connection to the broker failed or was closed; pending requests fail with it."""


class AuthenticationError(KafkaConnectionError):
    """The broker refused tierproxy's credentials or certificate."""


class UnsupportedVersionError(KafkaConnectionError):
    """The broker does not accept the version of a request tierproxy sends."""


def _tls_failure(host: str, port: int, error: ssl.SSLError) -> KafkaConnectionError:
    where = f"TLS with broker {host}:{port}"
    if isinstance(error, ssl.SSLCertVerificationError):
        if "hostname" in (error.verify_message or "") or "IP address mismatch" in (error.verify_message or ""):
            return AuthenticationError(f"{where}: {error.verify_message}; the certificate does not name {host} "
                                       "(check ssl.endpoint.identification.algorithm)")
        return AuthenticationError(f"{where}: the broker's certificate is not trusted ({error.verify_message}); "
                                   "check ssl.ca.location or ssl.truststore.location")
    reason = error.reason or type(error).__name__
    if reason in ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_HANDSHAKE_FAILURE", "SSLV3_ALERT_BAD_CERTIFICATE",
                  "TLSV1_ALERT_UNKNOWN_CA"):
        return AuthenticationError(f"{where}: the broker refused tierproxy's client certificate ({reason}); "
                                   "check ssl.keystore.location or ssl.certificate.location")
    return KafkaConnectionError(f"{where} failed ({reason}); does the listener speak the configured "
                                "security.protocol?")


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
        peer = writer.get_extra_info("peername")  # (host, port), or None once TLS has failed
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "broker"
        # api key -> (min version, max version) the broker accepts; empty until negotiated.
        self.api_versions: dict[int, tuple[int, int]] = {}

    @classmethod
    async def open(cls, host: str, port: int, *, security: Security = PLAINTEXT, timeout: float = 10.0,
                   **kwargs: Any) -> KafkaConnection:
        """Connected, versions negotiated and authenticated as `security` says."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=security.ssl_context,
                                        server_hostname=host if security.tls else None), timeout)
        except ssl.SSLError as e:
            raise _tls_failure(host, port, e) from None
        except (OSError, asyncio.TimeoutError) as e:
            raise KafkaConnectionError(f"cannot connect to broker {host}:{port}: {str(e) or 'timed out'}") from e
        connection = cls(reader, writer, **kwargs)
        try:
            await connection._negotiate_versions(timeout)
            if security.sasl:
                await connection._authenticate(security, timeout)
        except ssl.SSLError as e:  # TLS 1.3 reports a refused client certificate after the handshake
            await connection.close()
            raise _tls_failure(host, port, e) from None
        except BaseException:
            await connection.close()
            raise
        return connection

    async def _negotiate_versions(self, timeout: float) -> None:
        try:
            response = await self.request(
                ApiVersionsRequest(client_software_name=CLIENT_SOFTWARE_NAME, client_software_version=_version()),
                timeout=timeout)
        except KafkaConnectionError as e:
            reason = e.__cause__ if isinstance(e.__cause__, ssl.SSLError) else None
            if reason is not None:
                raise reason from None
            raise KafkaConnectionError(f"broker {self.peer} did not answer ApiVersions ({e}); does the listener "
                                       "speak the configured security.protocol?") from None
        if response.error_code != ErrorCode.none:
            raise KafkaConnectionError(f"ApiVersions on broker {self.peer}: {error_name(response.error_code)}")
        self.api_versions = {int(v.api_key): (int(v.min_version), int(v.max_version)) for v in response.api_keys}

    async def _authenticate(self, security: Security, timeout: float) -> None:
        assert security.credentials is not None
        user = security.credentials.username
        handshake = await self.request(SaslHandshakeRequest(mechanism=security.mechanism), timeout=timeout)
        if handshake.error_code != ErrorCode.none:
            raise AuthenticationError(
                f"broker {self.peer} does not accept sasl.mechanism={security.mechanism} "
                f"({error_name(handshake.error_code)}; it accepts {', '.join(handshake.mechanisms) or 'none'})")
        exchange = mechanism(security.mechanism, security.credentials)
        message: bytes | None = exchange.first()
        challenge = b""
        while message is not None:
            response = await self.request(SaslAuthenticateRequest(auth_bytes=message), timeout=timeout)
            if response.error_code != ErrorCode.none:
                raise AuthenticationError(
                    f"SASL {security.mechanism} authentication of user {user!r} on broker {self.peer} failed: "
                    f"{response.error_message or error_name(response.error_code)}; check sasl.username and "
                    "sasl.password (or sasl.jaas.config)")
            challenge = response.auth_bytes
            try:
                message = exchange.respond(challenge)
            except SaslError as e:
                raise AuthenticationError(f"SASL {security.mechanism} with broker {self.peer}: {e}") from None
        try:
            exchange.finish(challenge)
        except SaslError as e:
            raise AuthenticationError(f"SASL {security.mechanism} with broker {self.peer}: {e}") from None

    def check_version(self, api_key: int, version: int) -> None:
        """UnsupportedVersionError unless the broker accepts this request version."""
        if not self.api_versions:
            return
        accepted = self.api_versions.get(api_key)
        try:
            name = ApiKey(api_key).name
        except ValueError:  # a key kio does not know
            name = f"api key {api_key}"
        if accepted is None:
            raise UnsupportedVersionError(f"broker {self.peer} does not support {name}")
        if not accepted[0] <= version <= accepted[1]:
            raise UnsupportedVersionError(f"broker {self.peer} accepts {name} v{accepted[0]}-v{accepted[1]}; "
                                          f"tierproxy sends v{version}")

    async def request(self, payload: Any, *, timeout: float | None = 30.0) -> Any:
        """Send a kio request object and return the decoded kio response."""
        if self._closed_reason is not None:
            raise KafkaConnectionError(f"connection to {self.peer} is closed") from self._closed_reason
        self.check_version(payload.__api_key__, payload.__version__)
        correlation_id = next(self._correlation_ids) & 0x7FFFFFFF
        future = asyncio.get_running_loop().create_future()
        self._in_flight.append((correlation_id, payload.__api_key__, payload.__version__, future))
        self._writer.writelines(encode_frame(encode_request(payload, correlation_id, self._client_id)))
        try:
            await self._writer.drain()
        except OSError as e:  # the future then fails with this cause, like every pending one
            self._fail_pending(e)
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
            if api_key == ApiKey.API_VERSIONS and api_version > 0:
                # A broker that does not know this version answers in v0 (KIP-511).
                try:
                    future.set_result(decode_response(api_key, 0, body[offset:]))
                    return
                except ProtocolError:
                    pass
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
