"""The on-disk cache of compiled kernels, under ``kiln.config.cache_dir``.

Keyed by a hash of (source, compiler command, compiler version): a second process with
the same graph finds the shared library and compiles nothing. Libraries are sealed
entries (``kiln.disk_cache``): checked against their key and content hash before they
are ``dlopen``ed, so a truncated, garbage or swapped file is rebuilt, never loaded.
Keys, entries and atomic writes are ``kiln.disk_cache``'s (re-exported here for the
kernel compiler's modules).
"""
from __future__ import annotations

import functools
import importlib.util
import marshal
import os
import shlex
import subprocess
import tempfile
import types

from ...debug.logs import log_for
from ...debug.timing import timed
from ...disk_cache import (find_exact, key_of, locations, read_entry,  # noqa: F401  (re-exported)
                          reject, store_file, write_entry)
from ... import config
from .cxx_probe import workaround_flags
from .cxx_vecmath import vector_math_flags

_log = log_for("cache")

CXX = os.environ.get("CXX", "g++")
# -ffp-contract=off: GCC would otherwise fuse a*b+c into one FMA (one rounding where
# eager's kernels round twice), so a fused float32 expression such as softmax's backward
# differed from eager in the last place and the zoo's float64-referenced checks drifted.
CXXFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
            "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
            "-mprefer-vector-width=256"]
#: Lines of the compiler's output a BuildError quotes.
ERROR_LINES = 30

stats = {"hits": 0, "misses": 0}


class BuildError(RuntimeError):
    """A kernel library could not be built; says the command and the head of its output."""


@functools.lru_cache(None)
def toolchain_version() -> str:
    try:
        return subprocess.run([CXX, "--version"], capture_output=True, text=True,
                              check=True).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


def cxx_flags() -> tuple[str, ...]:
    """CXXFLAGS plus any workaround ``cxx_probe`` finds this compiler needs, plus the
    vector-math define when ``cxx_vecmath`` allows it."""
    return _cxx_flags(config.cpu_vector_math)[0]


def cxx_libs() -> tuple[str, ...]:
    """Libraries linked after the source (libmvec when vector math is on)."""
    return _cxx_flags(config.cpu_vector_math)[1]


@functools.lru_cache(None)
def _cxx_flags(vector_math: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    from ..codegen.cpp.source import PRELUDE
    flags = CXXFLAGS + workaround_flags(CXX, CXXFLAGS, toolchain_version())
    defines, libs = vector_math_flags(CXX, flags, toolchain_version(), PRELUDE) \
        if vector_math else ([], [])
    return tuple(flags + defines), tuple(libs)


cxx_flags.cache_clear = _cxx_flags.cache_clear     # what callers that swap $CXX clear


def _library_key(source: str) -> str:
    return key_of(source, " ".join([CXX, *cxx_flags(), *cxx_libs()]), toolchain_version())


def library_cached(source: str) -> bool:
    """Is the library of ``source`` in the cache (``compile_cpp`` would run no compiler)?"""
    return read_entry("cpp", _library_key(source), ".so") is not None


def compile_cpp(source: str) -> str:
    """Path of a shared library built from ``source``, compiling only on a cache miss
    (a missing entry, or one that fails its check). BuildError when the compiler fails."""
    flags, libs = list(cxx_flags()), list(cxx_libs())
    key = _library_key(source)
    found = read_entry("cpp", key, ".so")
    if found is not None:
        stats["hits"] += 1
        _log.info("kernels: C++ library cache hit %s", key)
        return found[0]
    stats["misses"] += 1
    _log.info("kernels: C++ library cache miss %s: compiling", key)
    # the source is kept beside the library, for whoever reads the cache (and for the
    # command a BuildError names to be run again by hand)
    src = store_file("cpp", key, ".cpp", source.encode())
    with timed("kernels.cxx"), tempfile.TemporaryDirectory(prefix="kiln-cxx-") as d:
        out = os.path.join(d, key + ".so")
        cmd = [CXX, *flags, src, "-o", out, *libs]
        _run_compiler(cmd)
        try:
            with open(out, "rb") as f:
                library = f.read()
        except OSError as e:
            raise BuildError(f"kiln: the C++ compiler made no library ({e.strerror}); "
                             f"command: {shlex.join(cmd)}") from None
    return write_entry("cpp", key, ".so", library)


def _run_compiler(cmd: list[str]) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise BuildError(f"kiln: the C++ compiler could not be run ({type(e).__name__}: "
                         f"{e}); command: {shlex.join(cmd)}. The compiler is $CXX "
                         f"(now {CXX!r})") from None
    if r.returncode != 0:
        head = "\n".join((r.stderr or r.stdout).splitlines()[:ERROR_LINES])
        raise BuildError(f"kiln: C++ compilation failed (exit status {r.returncode}); "
                         f"command: {shlex.join(cmd)}\n{head or '(no output)'}")


def write_source(kind: str, source: str, suffix: str) -> str:
    """Store a generated source (e.g. a Triton module) by content; return its path. A
    file there that does not hold exactly ``source`` is replaced."""
    key, data = key_of(source), source.encode()
    return find_exact(kind, key, suffix, data) or store_file(kind, key, suffix, data)


def load_module(kind: str, source: str, suffix: str = ".py"):
    """(module, path): generated Python ``source`` imported from its file under the
    cache (``write_source``; Triton reads its kernels' source back from there). The
    compiled code object is a sealed entry beside it, not Python's own ``.pyc``: that
    one is trusted by the source's mtime and size only, and a torn one fails every
    later import."""
    path = write_source(kind, source, suffix)
    key = key_of(source, path, importlib.util.MAGIC_NUMBER.hex())
    found = read_entry(kind + "_code", key, ".marshal")
    code = None
    if found is not None:
        try:
            code = marshal.loads(found[1])
        except (EOFError, ValueError, TypeError):
            code = None
    if not isinstance(code, types.CodeType):
        code = compile(source, path, "exec")
        try:
            write_entry(kind + "_code", key, ".marshal", marshal.dumps(code))
        except OSError:
            pass                     # compiled again next time
    mod = types.ModuleType(f"kiln_{kind}_{key_of(source)}")
    mod.__file__ = path
    exec(code, mod.__dict__)
    return mod, path
