"""The Kafka wire protocol: framing, headers, kio codecs, record-batch headers, codes.

No I/O here: no sockets, no asyncio, no object storage. Everything works on bytes.

- ``framing``: size-prefixed frames (FrameDecoder, encode_frame, split_frames).
- ``headers``: request/response headers read and written without the payload.
- ``codecs``: kio encode/decode of the intercepted APIs (INTERCEPTED).
- ``records``: record-batch headers, walked without decoding records.
- ``fetch_wire``: Fetch requests and responses walked and written without kio (the
  Fetch handler's hot paths).
- ``acks``: whether the broker answers a request (not a Produce with acks=0).
- ``apis``: ApiKey, ErrorCode, OffsetSpec.
- ``errors``: ProtocolError, FrameError, DecodeError.
"""
