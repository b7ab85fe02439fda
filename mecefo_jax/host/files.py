"""Files: written so that a reader, or a crash, sees the old bytes or the new ones, whole;
and read back as JSON, or None where there is nothing whole to read.

Bytes go to a temp file no other writer names, are flushed to disk, and take the final
name in one step (`os.replace`, or `os.link` where the first writer must win); the
directory is then synced, so the name survives a power loss. A failed write leaves no temp file.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
from typing import Any


@contextlib.contextmanager
def _synced_temp(path: str, data: bytes, mode: int):
    """A sibling file holding `data` on disk, named by pid and a random token so that no other
    writer uses it; removed afterwards unless it was renamed."""
    tmp = f'{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp'
    try:
        # O_EXCL: never write into another writer's file; `mode` & ~umask, as open() does.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        yield tmp
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _sync_directory(path: str) -> None:
    """Make a rename in `path`'s directory durable (a no-op where directories can't be synced)."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename itself is atomic
    finally:
        os.close(fd)


def write_bytes(path: str, data: bytes, *, mode: int = 0o666) -> None:
    """Replace `path` with `data` atomically and durably (`mode` as `os.open`'s, less the umask)."""
    with _synced_temp(path, data, mode) as tmp:
        os.replace(tmp, path)
    _sync_directory(path)


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode('utf-8'))


def write_json(path: str, value: Any, *, indent: int | None = 2, default=None,
               sort_keys: bool = False) -> None:
    write_text(path, json.dumps(value, indent=indent, default=default, sort_keys=sort_keys))


def create_bytes(path: str, data: bytes, *, replace_without_links: bool = False,
                 mode: int = 0o666) -> bool:
    """Create `path` holding `data` unless it exists; whether this call did. The first of
    concurrent writers wins; without hard links, `replace_without_links` lets the last win
    (still never partial), else the error is raised (a lock must not be taken twice)."""
    with _synced_temp(path, data, mode) as tmp:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:
            if not replace_without_links:
                raise
            os.replace(tmp, path)
    _sync_directory(path)
    return True


def read_json(path: str) -> Any:
    """The JSON value in `path`; None where it is missing, unreadable or not whole JSON."""
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
