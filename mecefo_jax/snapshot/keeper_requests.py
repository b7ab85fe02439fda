"""What a keeper accepts: each request's op and field types, the payload bound, the refusals.

Requests are `{'op': ..., fields}` dicts with an optional payload (a
parity chunk), sent as actor calls (`keeper_actor`) or in process
(`keeper_sessions.LocalKeeper`). Anyone who passes Ray's authentication can
call a keeper, so `check_request` vets every request before the keeper's
state (`keeper.Keeper`) sees it; the schema lives apart from that state so
that the rules read alone.
"""
from __future__ import annotations

# The only request with a payload is a parity chunk: 1/(g-1) of one worker's
# snapshot (snapshots themselves go through shared memory). A larger payload
# is refused; a job whose per-worker snapshot exceeds it times (g-1) raises it
# with `max_payload`.
MAX_PAYLOAD_BYTES = 16 << 30
# A `read` asks for one range per shard; more than this is not a request of ours.
MAX_READ_RANGES = 1 << 16
MAX_TEXT = 256  # group names, codes, session ids


class RequestError(Exception):
    """A request the keeper refuses; the message goes back to the client."""


class PayloadTooLarge(RequestError):
    """A payload over the keeper's `max_payload`."""


# Every request: its op and the type of each field it must carry.
_INT, _TEXT = 'int', 'text'
REQUESTS = {
    'hello': {},
    'list': {},
    'begin': {'nbytes': _INT},
    'publish': {'slot': _INT, 'token': _INT, 'step': _INT, 'nbytes': _INT, 'checksum': _INT,
                'header_offset': _INT, 'header_len': _INT},
    'pin': {'step': _INT},
    'unpin': {'slot': _INT},
    'read': {'step': _INT, 'ranges': 'ranges'},
    'parity_put': {'group': _TEXT, 'step': _INT, 'stripe': _INT, 'members': _INT,
                   'member': _INT, 'chunk_index': _INT, 'offset': _INT, 'length': _INT,
                   'chunk_crc': _INT, 'blob_nbytes': _INT, 'blob_checksum': _INT,
                   'code': _TEXT, 'generation': _INT},
    'parity_list': {'group': _TEXT},
    'parity_get': {'group': _TEXT, 'step': _INT},
}


def _well_typed(kind: str, value) -> bool:
    if kind == _INT:  # bool is an int subclass: refused too
        return type(value) is int and value >= 0
    if kind == _TEXT:
        return type(value) is str and len(value) <= MAX_TEXT
    return (isinstance(value, list) and len(value) <= MAX_READ_RANGES  # ranges
            and all(isinstance(r, list | tuple) and len(r) == 2
                    and all(_well_typed(_INT, x) for x in r) for r in value))


def _payload_size(payload) -> int:
    """Bytes in a payload (None, bytes-like or a list of them); -1 if it is none of those."""
    if payload is None:
        return 0
    parts = payload if isinstance(payload, list | tuple) else [payload]
    try:
        return sum(memoryview(p).nbytes for p in parts)
    except TypeError:
        return -1


def check_request(msg, payload, max_payload: int = MAX_PAYLOAD_BYTES) -> None:
    """Raise a RequestError unless `msg` is a request of this protocol with fields of the
    right types, and `payload` is bytes-like within `max_payload`."""
    if not isinstance(msg, dict) or msg.get('op') not in REQUESTS:
        op = msg.get('op') if isinstance(msg, dict) else None
        raise RequestError(f'Not a keeper request (op {op!r}; expected one of {sorted(REQUESTS)}).')
    for name, kind in REQUESTS[msg['op']].items():
        if not _well_typed(kind, msg.get(name)):
            raise RequestError(f"Keeper request {msg['op']!r}: field {name!r} is "
                               f'{msg.get(name)!r:.80}, not a valid {kind}.')
    size = _payload_size(payload)
    if size < 0:
        raise RequestError(f'A keeper payload must be bytes-like, not {type(payload).__name__}.')
    if size > max_payload:
        raise PayloadTooLarge(f"A payload of {size} bytes is over the keeper's limit of "
                              f'{max_payload} bytes; raise max_payload if the job needs it.')
