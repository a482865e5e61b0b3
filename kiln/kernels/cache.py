"""The on-disk cache of compiled kernels, under ``kiln.config.cache_dir``.

Keyed by a hash of (source, compiler command, compiler version): a second process with
the same graph finds the shared library and compiles nothing. Keys, paths and atomic
writes are ``kiln.disk_cache``'s (re-exported here for the kernel compiler's modules).
"""
from __future__ import annotations

import functools
import os
import subprocess
import tempfile

from ..debug.timing import timed
from ..disk_cache import cache_path, key_of, write_bytes, write_text  # noqa: F401  (re-exported)
from .cxx_probe import workaround_flags

CXX = os.environ.get("CXX", "g++")
# -ffp-contract=off: GCC would otherwise fuse a*b+c into one FMA (one rounding where
# eager's kernels round twice), so a fused float32 expression such as softmax's backward
# differed from eager in the last place and the zoo's float64-referenced checks drifted.
CXXFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
            "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
            "-mprefer-vector-width=256"]

stats = {"hits": 0, "misses": 0}


@functools.lru_cache(None)
def toolchain_version() -> str:
    try:
        return subprocess.run([CXX, "--version"], capture_output=True, text=True,
                              check=True).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@functools.lru_cache(None)
def cxx_flags() -> tuple[str, ...]:
    """CXXFLAGS plus any workaround ``cxx_probe`` finds this compiler needs."""
    return tuple(CXXFLAGS + workaround_flags(CXX, CXXFLAGS, toolchain_version()))


def compile_cpp(source: str) -> str:
    """Path of a shared library built from ``source``, compiling only on a cache miss."""
    flags = list(cxx_flags())
    key = key_of(source, " ".join([CXX] + flags), toolchain_version())
    so = cache_path("cpp", key, ".so")
    if os.path.exists(so):
        stats["hits"] += 1
        return so
    stats["misses"] += 1
    d = os.path.dirname(so)
    with timed("kernels.cxx"):
        fd, src = tempfile.mkstemp(suffix=".cpp", dir=d)
        with os.fdopen(fd, "w") as f:
            f.write(source)
        tmp_so = src[:-4] + ".so"
        r = subprocess.run([CXX, *flags, src, "-o", tmp_so], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"kiln: C++ compilation failed ({src}):\n{r.stderr[-4000:]}")
        os.replace(tmp_so, so)
        os.replace(src, so[:-3] + ".cpp")
    return so


def write_source(kind: str, source: str, suffix: str) -> str:
    """Store a generated source (e.g. a Triton module) by content; return its path."""
    key = key_of(source)
    path = cache_path(kind, key, suffix)
    if not os.path.exists(path):
        write_text(path, source)
    return path
