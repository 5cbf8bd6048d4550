"""SASL client exchanges for tierproxy's own connections: PLAIN (RFC 4616) and SCRAM
(RFC 5802 with SHA-256 / SHA-512, RFC 7677), as Kafka's `PlainSaslServer` and
`ScramSaslServer` expect them.

Each mechanism is a small state machine: `first()` gives the first client message,
`respond(challenge)` the next one (None once the client has nothing more to say), and
`finish(challenge)` checks the server's last word. The connection carries the bytes in SaslAuthenticate requests (KIP-152).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass


class SaslError(Exception):
    """The exchange failed in a way the broker did not report itself (a bad server proof)."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def __repr__(self) -> str:  # never print the password
        return f"Credentials(username={self.username!r}, password='[hidden]')"


class Plain:
    """One message: authzid NUL authcid NUL password; the broker answers nothing."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def first(self) -> bytes:
        return b"\0" + self._credentials.username.encode() + b"\0" + self._credentials.password.encode()

    def respond(self, challenge: bytes) -> bytes | None:
        return None

    def finish(self, challenge: bytes) -> None:
        pass


def _saslname(name: str) -> str:
    # RFC 5802 5.1: "=" and "," are escaped in user names.
    return name.replace("=", "=3D").replace(",", "=2C")


def _attributes(message: bytes) -> dict[str, str]:
    out = {}
    for part in message.decode().split(","):
        key, sep, value = part.partition("=")
        if sep:
            out[key] = value
    return out


class Scram:
    """SCRAM-SHA-256 or SCRAM-SHA-512: client-first, client-final, then the server's
    signature is verified, so a broker that does not know the password is caught too."""

    def __init__(self, credentials: Credentials, mechanism: str, *, nonce: str | None = None) -> None:
        self._credentials = credentials
        self._hash = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
        self._nonce = nonce or secrets.token_urlsafe(24)
        self._client_first_bare = f"n={_saslname(credentials.username)},r={self._nonce}"
        self._server_signature: bytes | None = None

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self._hash).digest()

    def first(self) -> bytes:
        return ("n,," + self._client_first_bare).encode()

    def respond(self, challenge: bytes) -> bytes | None:
        if self._server_signature is not None:
            return None  # the server-final message: `finish` checks it
        server_first = challenge.decode()
        attributes = _attributes(challenge)
        if "e" in attributes:
            raise SaslError(f"the broker refused the SCRAM exchange: {attributes['e']}")
        nonce, salt, iterations = attributes.get("r", ""), attributes.get("s"), attributes.get("i")
        if not nonce.startswith(self._nonce) or salt is None or iterations is None:
            raise SaslError("the broker's SCRAM challenge is malformed")
        salted = hashlib.pbkdf2_hmac(self._hash, self._credentials.password.encode(), base64.b64decode(salt),
                                     int(iterations))
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        final_without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._client_first_bare},{server_first},{final_without_proof}".encode()
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return f"{final_without_proof},p={base64.b64encode(proof).decode()}".encode()

    def finish(self, challenge: bytes) -> None:
        attributes = _attributes(challenge)
        if "e" in attributes:
            raise SaslError(f"the broker refused the SCRAM proof: {attributes['e']}")
        verifier = attributes.get("v")
        if self._server_signature is None or verifier is None or \
                not hmac.compare_digest(base64.b64decode(verifier), self._server_signature):
            raise SaslError("the broker's SCRAM signature does not match: it does not know this user's password")


def mechanism(name: str, credentials: Credentials) -> Plain | Scram:
    if name == "PLAIN":
        return Plain(credentials)
    if name in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        return Scram(credentials, name)
    raise ValueError(f"SASL mechanism {name!r} is not supported: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
