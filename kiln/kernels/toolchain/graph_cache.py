"""The whole-graph cache: lowering, scheduling and code generation, remembered on disk.

The kernel cache (``cxx_build.py``) already spares a second process the C++ and Triton
compilers; what remained per graph was kiln's own Python work — running the graph for
its metadata, lowering every node, fusing, generating source — about as long as the
compilers on a warm cache. This cache keeps the result of all of it, the ``Plan``.

The key is everything a plan depends on: the aten graph's code and the values of its
constants; the strides its nodes were traced with; the sizes, strides, dtypes and
devices of the inputs; the target; the settings and module-level tuning constants of
the kernel compiler and the hash of all of kiln's sources (so editing kiln, or a test
patching a block size, never reuses a stale plan);
the torch and Triton versions and the GPU's compute capability.

Plans are pickled, aten operators by name (``torch.ops`` objects do not pickle). A plan
that cannot be pickled (an extern calling a lambda, a large constant) is simply not
cached. Entries are sealed (``kiln.disk_cache``): one that fails its key and content
check, or does not unpickle, is a miss, rebuilt and replaced. ``KILN_GRAPH_CACHE=0``
switches it off.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import hashlib
import io
import os
import pickle
import sys
from dataclasses import dataclass, field

import torch
from torch.utils import _pytree as pytree

from ... import config, disk_cache
from ...debug.logs import log_for
from .. import ir
from . import cxx_build

_log = log_for("cache")
#: Constant tensors above this many bytes make a graph uncacheable (their bytes would
#: have to be hashed on every compile and stored in the entry).
MAX_CONSTANT_BYTES = 1 << 20
#: Bumped when the pickled layout of a plan changes.
FORMAT = 1

stats = {"hits": 0, "misses": 0, "stored": 0, "uncacheable": 0}


@dataclass
class Lowered:
    """What the runtime needs of a lowering: the buffers, the outputs (a pytree of
    views and constants) and the device."""
    buffers: list
    outputs: object
    device: torch.device

    @property
    def by_name(self):
        return {b.name: b for b in self.buffers}


@dataclass
class Plan:
    """A graph compiled up to, not including, loading its kernels."""
    lowered: Lowered
    sched: object                 # scheduler.Schedule
    source: str
    entries: list
    kinfo: list | None
    artefacts: dict
    fallback_messages: list = field(default_factory=list)   # (op, reason) to re-log
    #: the values the launches pass as size arguments (``codegen/size_args.SizeArgs``)
    size_args: object = None


# --- the key --------------------------------------------------------------------------
#: all of kiln's sources, not only the kernel compiler's: a plan also depends on the meta
#: kernels of kiln's own ops, fast_meta's layouts, the decompositions
_sources_hash = disk_cache.sources_hash


def _tuned_modules() -> tuple:
    """The modules whose constants shape a plan (lowering, scheduling, code generation)."""
    from .. import ir, matmul_fusion, scheduler
    from ..codegen.cpp import source as cpp_source
    from ..codegen.triton import (exprs, heuristics, kernel, matmul_epilogue, row_tiles,
                                   source as triton_source)
    from ..lowering import engine, recompute
    return (cpp_source, ir, engine, exprs, heuristics, kernel, matmul_epilogue, matmul_fusion,
            recompute, row_tiles, scheduler, triton_source)


def _module_constants() -> str:
    """Module-level UPPER_CASE tuning constants of the kernel compiler (tests patch them)."""
    parts = []
    for mod in _tuned_modules():
        for k, v in sorted(vars(mod).items()):
            if k.isupper() and isinstance(v, (int, float, str, bool, tuple)):
                parts.append(f"{mod.__name__}.{k}={v!r}")
    return ";".join(parts)


@functools.lru_cache(None)
def _versions(target: str, device: str) -> str:
    parts = [torch.__version__, sys.version.split()[0], str(FORMAT)]
    if target == "triton":
        # Triton's file stamps, not its version: no wait for its import (under way in
        # the background, triton_setup), and an edited installation is a new key
        from .triton_stamp import triton_stamp
        parts.append(triton_stamp() or "no-triton")
        parts.append(os.environ.get("TRITON_INTERPRET", "0"))
    if device.startswith("cuda") and torch.cuda.is_available():
        parts.append(str(torch.cuda.get_device_capability(torch.device(device))))
    return "|".join(parts)


def _constants(gm) -> str | None:
    """Digest of the graph's get_attr tensors; None when one is too large to cache."""
    h = hashlib.sha256()
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        val = gm
        for a in node.target.split("."):
            val = getattr(val, a)
        if isinstance(val, torch.Tensor):
            if val.numel() * val.element_size() > MAX_CONSTANT_BYTES:
                return None
            t = val.detach().cpu().contiguous().reshape(-1)       # (0-d: one element)
            h.update(f"{node.target}{tuple(val.shape)}{t.dtype}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(f"{node.target}={val!r}".encode())
    return h.hexdigest()


def _layouts(gm) -> str:
    """The strides the graph's nodes were traced with (``meta["val"]``): the layouts of
    outputs and library results follow them, and the graph's code does not say them."""
    parts = []
    for node in gm.graph.nodes:
        for v in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(v, torch.Tensor):
                parts.append(f"{v.stride()}{v.storage_offset()}")
    return ",".join(parts)


def key_of(gm, example_inputs, target: str) -> str | None:
    """The cache key of compiling ``gm`` for these inputs, or None (do not cache)."""
    if not config.graph_cache:
        return None
    consts = _constants(gm)
    if consts is None:
        return None
    sig = []
    device = "cpu"
    for a in example_inputs:
        if isinstance(a, torch.Tensor):
            sig.append(f"T{tuple(a.shape)}{a.stride()}{a.dtype}{a.device}")
            device = str(a.device) if a.device.type != "cpu" else device
        else:
            sig.append(f"V{type(a).__name__}:{a!r}")
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    internal = out.meta.get("kiln_internal_outputs_from")
    # a graph specialised to sizes names its code without generating it (``specialise``)
    code = repr(gm.meta["kiln_code_key"]) if "kiln_code_key" in gm.meta else gm.code
    return cxx_build.key_of(code, consts, ";".join(sig), f"internal={internal}",
                        _layouts(gm), target, _sources_hash(),
                        _module_constants(), _versions(target, device),
                        f"fallback_random={config.fallback_random}",
                        f"matmul_epilogue={config.matmul_epilogue != 'off'}",
                        f"small_matmul_macs={config.small_matmul_macs}",
                        f"autotune_min_numel={config.autotune_min_numel}",
                        f"kernel_size_args={config.kernel_size_args}",
                        f"kernel_size_args_min={config.kernel_size_args_min}",
                        f"recompute_pointwise={config.recompute_pointwise}",
                        f"triton_fast_division={config.triton_fast_division}",
                        f"triton_literal_divisors={config.triton_literal_divisors}",
                        f"triton_row_tiles={config.triton_row_tiles}",
                        f"regional={config.regional}",
                        f"inject_bug={config.inject_bug}")


# --- pickling -------------------------------------------------------------------------
def _op_by_name(namespace: str, name: str, overload: str | None):
    packet = getattr(getattr(torch.ops, namespace), name)
    return packet if overload is None else getattr(packet, overload)


def _buffer(cls, state):
    return cls(**state)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        if type(obj) in (ir.Pointwise, ir.Reduction) and obj.body is not None:
            # the loop bodies went into the generated source; the runtime needs only
            # names, sizes, strides and dtypes (and unpickling a graph's expression
            # trees would cost more than the rest of a hit)
            return _buffer, (type(obj), {f.name: getattr(obj, f.name)
                                         for f in dataclasses.fields(obj) if f.name != "body"})
        if isinstance(obj, torch._ops.OpOverload):
            return _op_by_name, (obj.namespace, obj._schema.name.split("::")[-1],
                                 obj._overloadname)
        if isinstance(obj, torch._ops.OpOverloadPacket):
            return _op_by_name, (obj._qualified_op_name.split("::")[0],
                                 obj._qualified_op_name.split("::")[-1], None)
        return NotImplemented


def load(key: str | None) -> Plan | None:
    """The plan stored under ``key``, if its entry checks out (``disk_cache``) and
    unpickles; anything else is a miss (logged) that the caller rebuilds and stores."""
    if key is None:
        return None
    found = cxx_build.read_entry("graphs", key, ".pkl")
    if found is None:
        stats["misses"] += 1
        return None
    enabled = gc.isenabled()
    gc.disable()          # many small objects at once: no collection passes meanwhile
    try:
        plan = pickle.loads(found[1])
        if not isinstance(plan, Plan):
            raise TypeError(f"a {type(plan).__name__}, not a Plan")
    except Exception as e:             # noqa: BLE001  (written by another kiln: rebuild)
        _log.warning("kiln: graph cache entry %s unreadable (%s: %s); rebuilding it",
                     found[0], type(e).__name__, e)
        stats["misses"] += 1
        return None
    finally:
        if enabled:
            gc.enable()
    stats["hits"] += 1
    return plan


def store(key: str | None, plan: Plan) -> bool:
    if key is None:
        return False
    buf = io.BytesIO()
    try:
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(plan)
    except Exception as e:             # noqa: BLE001  (e.g. an extern calling a lambda)
        stats["uncacheable"] += 1
        _log.info("kernels: graph not cached (%s: %s)", type(e).__name__, e)
        return False
    try:
        cxx_build.write_entry("graphs", key, ".pkl", buf.getvalue())
    except OSError as e:               # nowhere to keep it: compiled again next time
        _log.info("kernels: graph not cached (%s: %s)", type(e).__name__, e)
        return False
    stats["stored"] += 1
    return True
