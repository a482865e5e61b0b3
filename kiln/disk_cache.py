"""Files under ``kiln.config.cache_dir``: content keys, paths, atomic writes.

Shared by every stage that remembers something between processes (compiled kernels,
the decomposition table). Writes go to a temporary name and are renamed into place, so
concurrent processes never see half a file.
"""
from __future__ import annotations

import hashlib
import os
import tempfile

from . import config


def key_of(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def cache_path(kind: str, key: str, suffix: str) -> str:
    d = os.path.join(config.cache_dir, kind, key[:2])
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, key + suffix)


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary name, then rename)."""
    write_bytes(path, text.encode())


def write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary name, then rename)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
