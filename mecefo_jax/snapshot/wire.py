"""Framing of keeper requests and replies on a TCP stream.

One message = 12-byte prefix (JSON length, payload length), a JSON object,
then an optional raw payload. The payload is sent straight from its
buffers (shared memory, numpy arrays) and received into one preallocated
buffer, so snapshot bytes are never re-encoded.
"""
from __future__ import annotations

import json
import socket
import struct
from collections.abc import Sequence

_PREFIX = struct.Struct('!IQ')
# Requests and replies are small JSON objects (a few KiB); a larger one means
# the peer is not speaking this protocol.
MAX_JSON_BYTES = 1 << 20


class MessageTooLarge(ValueError):
    """A message claims more bytes than the receiver accepts; its bytes were not read."""


def configure(sock: socket.socket) -> None:
    # Without NODELAY a small request after a large reply waits for the
    # delayed ACK (~40 ms on Linux).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def send(sock: socket.socket, obj: dict, payload: Sequence | None = None) -> None:
    """Send `obj` and the concatenation of the buffers in `payload`."""
    raw = json.dumps(obj, separators=(',', ':')).encode()
    views = [memoryview(p).cast('B') for p in (payload or ())]
    sock.sendall(_PREFIX.pack(len(raw), sum(v.nbytes for v in views)) + raw)
    for v in views:
        if v.nbytes:
            sock.sendall(v)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError('Peer closed the connection in the middle of a message.')
        got += n


def recv(sock: socket.socket, *, max_payload: int | None = None) -> tuple[dict, bytearray | None]:
    """One message; raises EOFError on a clean close before its first byte.

    The lengths come from the peer: a header over MAX_JSON_BYTES or a payload
    over `max_payload` (None: no bound, for replies to requests this side
    made) raises MessageTooLarge before anything is allocated for it.
    """
    prefix = bytearray(_PREFIX.size)
    first = sock.recv_into(prefix)
    if first == 0:
        raise EOFError
    _recv_into(sock, memoryview(prefix)[first:])
    json_len, payload_len = _PREFIX.unpack(prefix)
    if json_len > MAX_JSON_BYTES:
        raise MessageTooLarge(f'Message header of {json_len} bytes (at most {MAX_JSON_BYTES}): '
                              'not a keeper peer.')
    if max_payload is not None and payload_len > max_payload:
        raise MessageTooLarge(f"Message payload of {payload_len} bytes exceeds this keeper's "
                              f'bound of {max_payload} bytes (--max-payload-bytes).')
    raw = bytearray(json_len)
    _recv_into(sock, memoryview(raw))
    payload = None
    if payload_len:
        payload = bytearray(payload_len)
        _recv_into(sock, memoryview(payload))
    return json.loads(raw), payload
