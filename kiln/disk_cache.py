"""Files under ``kiln.config.cache_dir``: content keys, sealed entries, atomic writes.

Shared by every stage that remembers something between processes (compiled kernels,
graph plans, the decomposition table). Writes go to a temporary name and are renamed
into place, so concurrent processes never see half a file.

Cache files are untrusted input (DESIGN.md, "Soundness rules"). An *entry*
(``write_entry`` / ``read_entry``) is its payload followed by a trailer: a JSON record
of the format, the kind and key it was stored under, the payload's size and sha256,
then its length and a magic word. ``read_entry`` checks all of it before the payload
is used; anything off (another entry copied over this one, a truncated, emptied or
garbage file, a directory where the file should be) is a miss, logged, which the
caller rebuilds and ``write_entry`` replaces. The trailer comes last so that a sealed
shared library is still an ELF file the loader accepts (it maps what the program
headers name and ignores bytes after them): it is checked, then ``dlopen``ed in place.
This is integrity, not security: whoever can write the cache directory can still
forge a trailer.

Where the cache directory cannot take an entry (read-only, a file, under a file, a
directory in the entry's place), the entry goes to a directory private to this
process instead (removed at exit), with one warning per cache directory: results stay
right; a later process only compiles again.
"""
from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import shutil
import struct
import tempfile
import threading

from . import config
from .debug.logs import log_for

_log = log_for("cache")
#: Bumped when the trailer's layout changes (older entries are then misses).
FORMAT = 1
MAGIC = b"KILNSEAL"
_TAIL = struct.Struct("<I8s")           # length of the JSON record, MAGIC
#: cache_dir -> this process's private stand-in for it (made on its first failed write)
_private: dict[str, str] = {}
_private_lock = threading.Lock()
stats = {"rejected": 0, "private_writes": 0}


class BadEntry(Exception):
    """A cache file that is not the entry it should be (the message says how)."""


def key_of(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


@functools.lru_cache(None)
def sources_hash() -> str:
    """Hash of all of kiln's sources (``.py`` and the C++ headers): an entry made by other
    kiln code (a plan, a captured entry) is never reused."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for d, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for f in sorted(files):
            if f.endswith((".py", ".h")):    # prelude.h is in every C++ source
                path = os.path.join(d, f)
                with open(path, "rb") as fh:
                    h.update(os.path.relpath(path, os.path.dirname(root)).encode() + b"\0" + fh.read())
    return h.hexdigest()


def _rel(kind: str, key: str, suffix: str) -> str:
    return os.path.join(kind, key[:2], key + suffix)


def cache_path(kind: str, key: str, suffix: str) -> str:
    """Where an entry lives under ``cache_dir`` (its directory made), or under this
    process's private directory when ``cache_dir`` cannot hold directories."""
    rel = _rel(kind, key, suffix)
    path = os.path.join(config.cache_dir, rel)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path
    except OSError as e:
        return _private_path(rel, e)


def _private_path(rel: str, why: OSError) -> str:
    """``rel`` under this process's private stand-in for ``cache_dir`` (made, and
    warned about, the first time)."""
    with _private_lock:
        d = _private.get(config.cache_dir)
        if d is None:
            d = _private[config.cache_dir] = tempfile.mkdtemp(prefix="kiln-cache-")
            atexit.register(shutil.rmtree, d, True)
            _log.warning("kiln: the cache directory %r cannot hold compiled artefacts "
                         "(%s: %s); this process keeps them in %s instead, removed at "
                         "exit", config.cache_dir, type(why).__name__, why, d)
    path = os.path.join(d, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


# --- sealed entries ---------------------------------------------------------------------
def seal(kind: str, key: str, payload: bytes) -> bytes:
    """``payload`` with the trailer that names it (see the module docstring)."""
    record = json.dumps({"format": FORMAT, "kind": kind, "key": key, "size": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest()},
                        sort_keys=True).encode()
    return payload + record + _TAIL.pack(len(record), MAGIC)


def unseal(kind: str, key: str, data: bytes) -> bytes:
    """The payload of ``data`` if it is the sealed entry ``kind``/``key``; BadEntry if not."""
    if len(data) < _TAIL.size:
        raise BadEntry(f"{len(data)} bytes, shorter than a trailer")
    n, magic = _TAIL.unpack_from(data, len(data) - _TAIL.size)
    end = len(data) - _TAIL.size - n
    if magic != MAGIC or end < 0:
        raise BadEntry("no kiln trailer (truncated, garbage, or not written by kiln)")
    try:
        record = json.loads(data[end:len(data) - _TAIL.size])
    except ValueError as e:
        raise BadEntry(f"unreadable trailer ({e})") from None
    if not isinstance(record, dict):
        raise BadEntry("unreadable trailer")
    for field, want in (("format", FORMAT), ("kind", kind), ("key", key), ("size", end)):
        if record.get(field) != want:
            raise BadEntry(f"its {field} is {record.get(field)!r}, not {want!r}")
    payload = data[:end]
    if hashlib.sha256(payload).hexdigest() != record.get("sha256"):
        raise BadEntry("its content does not match its sha256")
    return payload


def locations(kind: str, key: str, suffix: str) -> list[str]:
    """Where the file of ``kind``/``key`` may be: under ``cache_dir``, then in this
    process's private directory if it has one."""
    rel = _rel(kind, key, suffix)
    out = [os.path.join(config.cache_dir, rel)]
    if config.cache_dir in _private:
        out.append(os.path.join(_private[config.cache_dir], rel))
    return out


def read_entry(kind: str, key: str, suffix: str) -> tuple[str, bytes] | None:
    """(path, payload) of the entry stored under ``key``, checked; None when there is
    none that checks out (a rejected file is logged and counted, never used)."""
    for path in locations(kind, key, suffix):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:                  # a directory, unreadable, ...
            reject(path, f"{type(e).__name__}: {e.strerror or e}")
            continue
        try:
            return path, unseal(kind, key, data)
        except BadEntry as e:
            reject(path, str(e))
    return None


def reject(path: str, why: str) -> None:
    """Log and count a cache file that is not what its name says (never used)."""
    stats["rejected"] += 1
    _log.warning("kiln: cache entry %s rejected (%s); rebuilding it", path, why)


def write_entry(kind: str, key: str, suffix: str, payload: bytes) -> str:
    """Store ``payload`` sealed under ``key``, atomically replacing whatever is there;
    returns its path (``store_file``)."""
    return store_file(kind, key, suffix, seal(kind, key, payload))


def find_exact(kind: str, key: str, suffix: str, data: bytes) -> str | None:
    """The path of a stored plain file holding exactly ``data`` (for files whose key is
    their content's hash and that others read by path: generated Python modules); a
    file there with other content is rejected (logged), and None returned."""
    for path in locations(kind, key, suffix):
        try:
            with open(path, "rb") as f:
                if f.read() == data:
                    return path
            reject(path, "its content is not the one its key names")
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            reject(path, f"{type(e).__name__}: {e.strerror or e}")
    return None


def store_file(kind: str, key: str, suffix: str, data: bytes) -> str:
    """Write ``data`` as the file of ``kind``/``key`` atomically, replacing whatever is
    there; returns its path, in this process's private directory when ``cache_dir``
    cannot take it. OSError only when neither can."""
    rel = _rel(kind, key, suffix)
    path = os.path.join(config.cache_dir, rel)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_bytes(path, data)
        return path
    except OSError as e:
        path = _private_path(rel, e)
    write_bytes(path, data)
    stats["private_writes"] += 1
    return path


# --- plain files ------------------------------------------------------------------------
def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary name, then rename)."""
    write_bytes(path, text.encode())


def write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary name, then rename); an empty
    directory in its place is removed first. OSError when it cannot be done."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            os.replace(tmp, path)
        except IsADirectoryError:
            os.rmdir(path)                     # only an empty one; else OSError
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
