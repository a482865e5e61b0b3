"""Replay of a failed capture (``KILN_REPLAY_RECORD=1``; ``python -m kiln.replay FILE``).

When capturing a frame fails — an internal error, or ``Unsupported`` under fullgraph —
``record`` writes one file (``torch.save`` of a dict) holding what the capture read:

- the frame's code object (``marshal``; replayed only by the same Python version),
  its name, file and line, its defaults and closure cells;
- the call's arguments: tensors as saved tensors (geometry and requires_grad kept; one
  that required grad comes back as a leaf),
  simple Python values (numbers, strings, None, containers of them) as they are;
- the globals its code names (``co_names``, nested code included): modules by name,
  importable functions and classes by import path, the user's own plain functions by
  their code (recursively, so helpers come along), tensors and simple values as they
  are; anything else is pickled when it can be (its class must be importable to load)
  or noted as missing;
- the kiln settings, and the error (type, message, traceback).

``load`` rebuilds the function over those globals, ``summary`` describes a record;
``kiln/replay.py`` runs it through capture alone (it imports capture's entry point,
which imports this module to record).
"""
from __future__ import annotations

import builtins
import importlib
import logging
import marshal
import os
import pickle
import sys
import traceback
import types

import torch

from kiln import config

log = logging.getLogger("kiln.replay")
FORMAT = 1
_SIMPLE = (int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device)
_LIBRARY_TOPS = frozenset({"torch", "kiln", "numpy"}) | frozenset(sys.stdlib_module_names)
_count = [0]


# --- encoding ------------------------------------------------------------------------
def _import_path(v):
    mod, qual = getattr(v, "__module__", None), getattr(v, "__qualname__", None)
    if not mod or not qual or mod == "__main__" or "<" in qual:
        return None
    try:
        found = importlib.import_module(mod)
        for part in qual.split("."):
            found = getattr(found, part)
    except Exception:  # noqa: BLE001 -- not importable: recorded otherwise
        return None
    return (mod, qual) if found is v else None


def _encode(v, functions: dict, depth=0):
    """A value as the record keeps it: ("value", v) | ("tensor", t) | ("module", name) |
    ("import", mod, qual) | ("function", name) | ("seq", type, items) |
    ("dict", items) | ("pickled", bytes) | ("missing", repr)."""
    if isinstance(v, torch.Tensor):
        return ("tensor", v.detach(), v.requires_grad)   # views keep their geometry
    if isinstance(v, _SIMPLE):
        return ("value", v)
    if isinstance(v, types.ModuleType):
        return ("module", v.__name__)
    if isinstance(v, (tuple, list)) and depth < 8:
        return ("seq", type(v).__name__, [_encode(x, functions, depth + 1) for x in v])
    if type(v) is dict and depth < 8:
        return ("dict", [(_encode(k, functions, depth + 1), _encode(x, functions, depth + 1))
                         for k, x in v.items()])
    path = _import_path(v)
    if path is not None and (isinstance(v, (type, types.BuiltinFunctionType))
                             or path[0].split(".")[0] in _LIBRARY_TOPS
                             or not isinstance(v, types.FunctionType)):
        return ("import", *path)
    if isinstance(v, types.FunctionType):
        _add_function(v, functions)
        return ("function", _fn_key(v))
    try:
        return ("pickled", pickle.dumps(v))
    except Exception:  # noqa: BLE001 -- noted as missing
        return ("missing", f"{type(v).__qualname__}: {reprlib_repr(v)}")


def reprlib_repr(v) -> str:
    try:
        r = repr(v)
    except Exception:  # noqa: BLE001
        r = object.__repr__(v)
    return r if len(r) < 200 else r[:197] + "..."


def _fn_key(fn) -> str:
    return f"{fn.__module__}.{fn.__qualname__}@{id(fn.__code__)}"


def _names(code) -> set:
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


def _read_globals(code, g: dict, functions: dict) -> dict:
    out = {}
    for name in sorted(_names(code)):
        if name in g and not name.startswith("__"):
            out[name] = _encode(g[name], functions)
    return out


def _add_function(fn, functions: dict):
    key = _fn_key(fn)
    if key in functions or len(functions) > 200:
        return
    functions[key] = None  # placeholder against cycles
    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append(_encode(cell.cell_contents, functions))
        except ValueError:  # an empty cell
            cells.append(("empty",))
    functions[key] = {
        "name": fn.__name__, "qualname": fn.__qualname__, "code": marshal.dumps(fn.__code__),
        "defaults": _encode(fn.__defaults__, functions) if fn.__defaults__ else None,
        "kwdefaults": _encode(fn.__kwdefaults__, functions) if fn.__kwdefaults__ else None,
        "cells": cells, "globals": _read_globals(fn.__code__, fn.__globals__, functions),
    }


def _settings() -> dict:
    return {k: v for k, v in vars(config).items()
            if not k.startswith("_") and isinstance(v, (int, float, bool, str))}


def replay_dir() -> str:
    trace = getattr(config, "trace_dir", None)
    return os.path.join(trace, "replay") if trace else os.path.join(os.getcwd(), "kiln_replay")


def record(fn, args, kwargs, fullgraph: bool, error: BaseException) -> str | None:
    """Write the record of a failed capture of ``fn(*args, **kwargs)``; its path."""
    try:
        functions: dict = {}
        _add_function(fn, functions)
        rec = {
            "format": FORMAT, "python": list(sys.version_info[:2]), "torch": torch.__version__,
            "root": _fn_key(fn), "functions": functions,
            "filename": fn.__code__.co_filename, "firstlineno": fn.__code__.co_firstlineno,
            "args": _encode(tuple(args), functions), "kwargs": _encode(dict(kwargs), functions),
            "fullgraph": fullgraph, "config": _settings(),
            "error": {"type": type(error).__qualname__, "message": str(error),
                      "traceback": "".join(traceback.format_exception(error))},
        }
        d = replay_dir()
        os.makedirs(d, exist_ok=True)
        _count[0] += 1
        path = os.path.join(d, f"{fn.__code__.co_name}_{os.getpid()}_{_count[0]}.kiln-replay")
        torch.save(rec, path)
    except Exception as e:  # noqa: BLE001 -- a debugging aid must not mask the failure
        log.warning("kiln: could not write a replay record for %s: %s: %s",
                    fn.__code__.co_name, type(e).__name__, e)
        return None
    log.warning("kiln: capture of %s failed (%s); replay record written to %s "
                "(python -m kiln.replay %s)", fn.__code__.co_name, type(error).__name__, path, path)
    return path


# --- decoding ------------------------------------------------------------------------
class _Decoder:
    def __init__(self, rec):
        self.rec = rec
        self.namespace = {"__builtins__": builtins, "__name__": "kiln_replay"}
        self.built: dict = {}
        self.missing: list = []

    def value(self, enc):
        kind = enc[0]
        if kind == "value":
            return enc[1]
        if kind == "tensor":
            return enc[1].requires_grad_(True) if enc[2] else enc[1]
        if kind == "module":
            return importlib.import_module(enc[1])
        if kind == "import":
            found = importlib.import_module(enc[1])
            for part in enc[2].split("."):
                found = getattr(found, part)
            return found
        if kind == "seq":
            items = [self.value(x) for x in enc[2]]
            return tuple(items) if enc[1] == "tuple" else list(items)
        if kind == "dict":
            return {self.value(k): self.value(v) for k, v in enc[1]}
        if kind == "function":
            return self.function(enc[1])
        if kind == "pickled":
            try:
                return pickle.loads(enc[1])
            except Exception as e:  # noqa: BLE001 -- its class is the user's, not here
                self.missing.append(f"a pickled value ({type(e).__name__}: {e})")
                return None
        if kind == "missing":
            self.missing.append(enc[1])
            return None
        raise ValueError(f"unknown record entry {kind!r}")

    def function(self, key):
        if key in self.built:
            return self.built[key]
        f = self.rec["functions"][key]
        code = marshal.loads(f["code"])
        cells = tuple(types.CellType() if c[0] == "empty" else types.CellType(None)
                      for c in f["cells"])
        fn = types.FunctionType(code, self.namespace, f["name"], None, cells or None)
        fn.__qualname__ = f["qualname"]
        self.built[key] = fn
        for name, enc in f["globals"].items():
            if name not in self.namespace:
                self.namespace[name] = self.value(enc)
        for cell, enc in zip(cells, f["cells"]):
            if enc[0] != "empty":
                cell.cell_contents = self.value(enc)
        if f["defaults"] is not None:
            fn.__defaults__ = tuple(self.value(f["defaults"]))
        if f["kwdefaults"] is not None:
            fn.__kwdefaults__ = self.value(f["kwdefaults"])
        return fn


def load(path):
    """(function, args, kwargs, record) rebuilt from a record file."""
    rec = torch.load(path, weights_only=False)
    if rec.get("format") != FORMAT:
        raise ValueError(f"{path}: not a kiln replay record of format {FORMAT}")
    if tuple(rec["python"]) != sys.version_info[:2]:
        raise RuntimeError(f"{path} was recorded by Python {'.'.join(map(str, rec['python']))}; "
                           f"its code object cannot be loaded by {sys.version.split()[0]}")
    dec = _Decoder(rec)
    fn = dec.function(rec["root"])
    args, kwargs = dec.value(rec["args"]), dec.value(rec["kwargs"])
    rec["missing"] = dec.missing
    return fn, args, kwargs, rec


def _describe(v) -> str:
    if isinstance(v, torch.Tensor):
        rg = ", requires_grad" if v.requires_grad else ""
        return f"tensor {tuple(v.shape)} {str(v.dtype).replace('torch.', '')} {v.device}" \
               f" stride {v.stride()}{rg}"
    return reprlib_repr(v)


def summary(fn, args, kwargs, rec) -> str:
    code = fn.__code__
    lines = [f"kiln replay of {fn.__qualname__} ({rec['filename']}:{rec['firstlineno']})",
             f"  recorded failure: {rec['error']['type']}: {rec['error']['message']}",
             f"  fullgraph={rec['fullgraph']}, recorded with torch {rec['torch']}",
             "  arguments:"]
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    for i, a in enumerate(args):
        lines.append(f"    {names[i] if i < len(names) else f'*{i}'}: {_describe(a)}")
    for k, v in kwargs.items():
        lines.append(f"    {k}: {_describe(v)}")
    root = rec["functions"][rec["root"]]
    if root["globals"]:
        lines.append("  globals read: " + ", ".join(sorted(root["globals"])))
    helpers = [f["qualname"] for k, f in rec["functions"].items() if k != rec["root"]]
    if helpers:
        lines.append("  user functions recorded: " + ", ".join(helpers))
    if rec["missing"]:
        lines.append("  NOT recorded (None in the replay): " + "; ".join(rec["missing"]))
    return "\n".join(lines)
