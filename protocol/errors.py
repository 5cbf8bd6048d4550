"""Exceptions raised by the wire layer. Nothing here does I/O."""


class ProtocolError(Exception):
    """Base class for bytes that do not follow the Kafka wire protocol."""


class FrameError(ProtocolError):
    """A size-prefixed frame is negative, larger than allowed, or truncated.

    The connection carrying it cannot be resynchronised and must be closed.
    """


class DecodeError(ProtocolError):
    """A frame or record batch could not be decoded (garbage, truncation, bad CRC)."""
