"""Triton's installation key from file stamps, found without importing Triton.

Both the set-up (``triton_setup``, which installs it as Triton's ``triton_key``) and
the compile workers (``triton_pool``, which hand it to each worker) need it; it lives
here so that neither imports the other for it.
"""
from __future__ import annotations

import functools
import importlib.util
import os

from . import cxx_build


def stamp(triton_dir: str) -> str:
    """A key of the path, size and modification time of the files ``triton_key``
    hashes (Triton's compiler, backends, language, runtime and its C library)."""
    parts = []
    for sub in ("compiler", "backends", "language", "runtime", "_C"):
        top = os.path.join(triton_dir, sub)
        for root, dirs, files in os.walk(top):
            dirs.sort()
            for f in sorted(files):
                if f.endswith((".py", ".so")):
                    p = os.path.join(root, f)
                    st = os.stat(p)
                    parts.append(f"{p}:{st.st_size}:{st.st_mtime_ns}")
    return cxx_build.key_of(*parts)


def triton_dir() -> str | None:
    """Where Triton is installed, found without importing it."""
    spec = importlib.util.find_spec("triton")
    locs = getattr(spec, "submodule_search_locations", None) if spec else None
    return os.path.abspath(locs[0]) if locs else None


@functools.lru_cache(None)
def triton_stamp() -> str | None:
    d = triton_dir()
    try:
        return stamp(d) if d else None
    except OSError:
        return None
