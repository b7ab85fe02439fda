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
# Requests and replies are small JSON objects; a larger one means the peer
# is not speaking this protocol.
_MAX_JSON = 64 << 20


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


def recv(sock: socket.socket) -> tuple[dict, bytearray | None]:
    """One message; raises EOFError on a clean close before its first byte."""
    prefix = bytearray(_PREFIX.size)
    first = sock.recv_into(prefix)
    if first == 0:
        raise EOFError
    _recv_into(sock, memoryview(prefix)[first:])
    json_len, payload_len = _PREFIX.unpack(prefix)
    if json_len > _MAX_JSON:
        raise ConnectionError(f'Message header of {json_len} bytes: not a keeper peer.')
    raw = bytearray(json_len)
    _recv_into(sock, memoryview(raw))
    payload = None
    if payload_len:
        payload = bytearray(payload_len)
        _recv_into(sock, memoryview(payload))
    return json.loads(raw), payload
