"""The Kafka wire protocol: framing, headers, kio codecs, record-batch headers, codes.

No I/O here: no sockets, no asyncio, no object storage. Everything works on bytes.
"""
