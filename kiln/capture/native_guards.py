"""Tensor guards checked in C++: one call per entry instead of six Python checks a tensor.

An entry guards each input tensor's type, dtype, device, sizes, strides and
requires_grad (``GuardSet.tensor``). In Python that is about 0.45 us a tensor, because
every attribute read builds a Python object; a model's parameters make it the largest
part of a replayed call's host time (mobilenet_v3_small: 244 tensors, ~110 us). The
library built from ``native_guards.cpp`` reads the same facts from each tensor's
TensorImpl: ~2.6 us for all 244.

How an entry uses it (``guard_codes``): the metadata guards of the tensors it covers
leave the entry's ``and`` chain, and one last guard ``__native_tensors((t0, t1, ...))``
takes their place, after every other guard; it checks their exact types too (a
tensor's type guard stays in the chain where another guard reads through the tensor,
``x.grad``). Guards are pure, so only their order of evaluation changes (a guard that
raises is a miss wherever it stands). ``entry.guards`` keeps every Python guard: a miss is still
explained guard by guard (``first_failure``).

The library is built once per installation (torch, Python, compiler and source are its
key) under ``config.native_dir``, not ``cache_dir``: it is kiln's own code, not a
program's artefact, and a fresh compile cache must not rebuild it. The first process
that needs it builds it in a background thread (about 10 s of one core); its entries
meanwhile check the same specs in Python (``python_check``) and switch to the library
when it is loaded. Where it cannot be built (no compiler, no Python headers) or
``KILN_NATIVE_GUARDS`` is off, entries keep their Python guards inline, as before. The
file is a sealed entry (``kiln.disk_cache``): checked before it is loaded, rebuilt when
it is not what its key names.

Only exact ``torch.Tensor`` and ``nn.Parameter`` of strided layout are covered: a
subclass may override ``shape`` or ``stride`` in Python, where the C++ reading would
not see it.
"""
from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import logging
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import threading
import weakref

import torch

from kiln import config
from kiln import disk_cache
from kiln.debug.logs import log_for

_log = log_for("guards")
_SOURCE = os.path.join(os.path.dirname(__file__), "native_guards.cpp")
_MODULE_NAME = "kiln_native_guards"
#: the entry namespace's name for the check (a guard constant is never named so)
CHECK_NAME = "__native_tensors"
COVERED_TYPES = (torch.Tensor, torch.nn.Parameter)

_lock = threading.Lock()
_state = {"module": None, "status": "idle", "why": None}   # idle|building|ready|failed
#: entries waiting for the library: (weak entry function, its specs)
_waiting: list = []


# --- what a spec is ---------------------------------------------------------------------
def covers(t: torch.Tensor) -> bool:
    """Can the library check ``t``'s metadata guards exactly as Python would?"""
    return type(t) in COVERED_TYPES and t.layout is torch.strided and not t.is_nested


def spec_of(t: torch.Tensor, requires_grad) -> tuple:
    """(type, dtype, device, sizes, strides, requires_grad or None): what the guards
    pinned; None leaves requires_grad to a Python guard."""
    return (type(t), t.dtype, t.device, tuple(t.shape), tuple(t.stride()), requires_grad)


def python_check(specs, tensors) -> bool:
    """The library's check in Python, for entries made while it builds: the same
    comparisons as the Python guards (an exception is a miss, as in the chain)."""
    for (tp, dt, dev, sizes, strides, rg), t in zip(specs, tensors):
        if type(t) is not tp or t.dtype is not dt or t.device != dev or t.shape != sizes \
                or t.stride() != strides or (rg is not None and t.requires_grad is not rg):
            return False
    return True


# --- entries ----------------------------------------------------------------------------
def guard_codes(guards, ns: dict, argnames=()) -> tuple[list[str], list | None]:
    """(the entry's guard expressions, specs to watch or None). With the library loaded
    or being built, the covered tensors' metadata guards become one check at the end;
    with it loaded, runs of the other guards become programs (``guard_program``;
    ``argnames``: the entry's parameters); otherwise every guard stays as it is."""
    codes = [g.code for g in guards.guards]
    if not _usable():
        return codes, None
    codes, waiting = _tensor_check(guards, codes, ns)
    module = _state["module"]
    if module is not None and guards.programs:
        from kiln.capture import guard_program
        codes = guard_program.build(codes, guards.programs, ns, module, set(argnames))
    return codes, waiting


def _tensor_check(guards, codes: list[str], ns: dict) -> tuple[list[str], list | None]:
    if not guards.tensor_specs:
        return codes, None
    present = set(codes)
    covered, exprs, specs = set(), [], []
    for expr, (spec, spec_codes) in guards.tensor_specs.items():
        if not present.issuperset(spec_codes):   # guards dropped on purpose (drop_since)
            continue
        exprs.append(expr)
        specs.append(spec)
        covered.update(spec_codes)
    if not specs:
        return codes, None
    # a guard left in the chain that reads through a covered tensor (``x.grad``) keeps
    # that tensor's type guard before it, as the chain had it: it never reads an
    # attribute of an object of another type
    from kiln.capture.guard_cse import path_prefixes
    read_through = set()
    for c in codes:
        if c not in covered:
            read_through.update(path_prefixes(c))
    for expr, (_, spec_codes) in guards.tensor_specs.items():
        if expr in read_through:
            covered.discard(spec_codes[0])
    codes = [c for c in codes if c not in covered]
    codes.append(f"{CHECK_NAME}(({', '.join(exprs)},))")
    module = _state["module"]
    if module is not None:
        ns[CHECK_NAME] = _native_check(module, specs)
        return codes, None
    ns[CHECK_NAME] = functools.partial(python_check, specs)
    return codes, specs


def watch(entry_fn, specs) -> None:
    """Switch ``entry_fn``'s check to the library once it is loaded (``specs`` from
    ``guard_codes``; None: nothing to switch)."""
    if specs is None:
        return
    with _lock:
        if _state["module"] is None:
            _waiting.append((weakref.ref(entry_fn), specs))
            return
    _switch(entry_fn, specs)


def _native_check(module, specs):
    return functools.partial(module.check, module.make_specs(specs))


def _switch(entry_fn, specs) -> None:
    # one dict store: an entry running on another thread sees the old check or the new
    entry_fn.__globals__[CHECK_NAME] = _native_check(_state["module"], specs)


def _usable() -> bool:
    """Is the library loaded, or being built? Starts the build on first use."""
    if not config.native_guards:
        return False
    status = _state["status"]
    if status == "idle":
        with _lock:
            if _state["status"] == "idle":
                if _load_built():
                    return True
                if _state["status"] == "failed":     # on disk, but it does not load
                    return False
                _state["status"] = "building"
                threading.Thread(target=_build_and_load, name="kiln-native-guards",
                                 daemon=True).start()
        status = _state["status"]
    return status in ("ready", "building")


# --- building and loading ---------------------------------------------------------------
def _torch_dir() -> str:
    return os.path.dirname(torch.__file__)


def _command(source_path: str, out: str, std: str) -> list[str]:
    tdir = _torch_dir()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [os.environ.get("CXX", "g++"), "-O2", "-shared", "-fPIC", f"-std={std}",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-w",
            "-I" + sysconfig.get_paths()["include"], "-I" + os.path.join(tdir, "include"),
            "-I" + os.path.join(tdir, "include", "torch", "csrc", "api", "include"),
            source_path, "-o", out, "-L" + os.path.join(tdir, "lib"),
            "-Wl,-rpath," + os.path.join(tdir, "lib"), "-ltorch_python", "-lc10", "-ltorch_cpu"]


@functools.lru_cache(None)
def _key() -> str:
    with open(_SOURCE) as f:
        source = f.read()
    from kiln.kernels.toolchain.cxx_build import toolchain_version
    return disk_cache.key_of(source, torch.__version__, str(torch.version.git_version),
                             sys.version, sysconfig.get_config_var("EXT_SUFFIX") or "",
                             " ".join(_command("SRC", "OUT", "STD")), toolchain_version())


def library_path() -> str:
    return os.path.join(config.native_dir, f"{_MODULE_NAME}-{_key()}.so")


def _load_built() -> bool:
    """Load the library if a checked one is on disk (call under ``_lock``)."""
    path = library_path()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    try:
        disk_cache.unseal("native_guards", _key(), data)
    except disk_cache.BadEntry as e:
        disk_cache.reject(path, str(e))
        return False
    return _import(path)


def _import(path: str) -> bool:
    try:
        loader = importlib.machinery.ExtensionFileLoader(_MODULE_NAME, path)
        spec = importlib.util.spec_from_file_location(_MODULE_NAME, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except Exception as e:  # noqa: BLE001  (a library that does not load: guards stay in Python)
        _state["status"], _state["why"] = "failed", f"{type(e).__name__}: {e}"
        _log.info("native tensor guards unavailable: %s", _state["why"])
        return False
    _state["module"], _state["status"] = module, "ready"
    return True


def _compile() -> bytes:
    """The library's bytes; RuntimeError with the compiler's words when it fails."""
    errors = []
    with tempfile.TemporaryDirectory(prefix="kiln-native-") as d:
        out = os.path.join(d, "lib.so")
        for std in ("c++20", "c++17"):       # torch's headers need 20 from 2.13 on
            cmd = _command(_SOURCE, out, std)
            try:
                r = subprocess.run(cmd, capture_output=True, text=True)
            except OSError as e:
                raise RuntimeError(f"the C++ compiler could not be run ({e})") from None
            if r.returncode == 0:
                with open(out, "rb") as f:
                    return f.read()
            errors.append(f"{shlex.join(cmd)}\n" + "\n".join((r.stderr or r.stdout).splitlines()[:10]))
    raise RuntimeError("building the native tensor guards failed:\n" + "\n".join(errors))


def _store(payload: bytes) -> str:
    """Write the sealed library under native_dir (a private temporary one when that
    cannot be written); its path."""
    sealed = disk_cache.seal("native_guards", _key(), payload)
    path = library_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        disk_cache.write_bytes(path, sealed)
    except OSError as e:
        _log.info("native tensor guards: %s not writable (%s); kept for this process only",
                  config.native_dir, e)
        path = os.path.join(tempfile.mkdtemp(prefix="kiln-native-"), os.path.basename(path))
        disk_cache.write_bytes(path, sealed)
    return path


def _build_and_load() -> bool:
    try:
        path = _store(_compile())
    except (RuntimeError, OSError) as e:
        with _lock:
            _state["status"], _state["why"] = "failed", str(e)
            _waiting.clear()
        _log.info("native tensor guards unavailable (the Python guards are used): %s", e)
        return False
    with _lock:
        if not _import(path):
            _waiting.clear()
            return False
    _switch_waiting()
    return True


def _switch_waiting() -> None:
    """The library is loaded: every entry made while it was building now uses it."""
    with _lock:
        waiting = list(_waiting)
        _waiting.clear()
    for ref, specs in waiting:
        fn = ref()
        if fn is not None:
            _switch(fn, specs)


def ensure_built() -> str | None:
    """Build (if needed) and load the library now; None when it is loaded, else why
    not. ``main`` calls it (the set-up script does)."""
    if not config.native_guards:
        return "KILN_NATIVE_GUARDS is off"
    with _lock:
        if _state["status"] == "ready":
            return None
        loaded = _load_built()
    if not loaded and not _build_and_load():
        return _state["why"]
    return None


def status() -> tuple[str, str | None]:
    """(idle | building | ready | failed, why it failed)."""
    return _state["status"], _state["why"]


def main() -> int:
    """Build the library now and say where it is (the set-up script runs this)."""
    logging.basicConfig()
    why = ensure_built()
    print(f"kiln native tensor guards: {library_path() if why is None else 'not built: ' + why}")
    return 0
