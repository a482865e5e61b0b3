"""The autograd trace of a graph, remembered on disk (``KILN_TRACE_CACHE``).

With capture's result cached (``capture/capture_cache.py``), a warm process's first
call still traced each torch-level graph through the dispatcher for its aten graph
(``trace_joint``): the first dispatch of every op in the process, then the
functionalisation. The result, a ``TraceResult``, is a graph with meta tensors in its
node metadata and plain bookkeeping, so it is kept here and read back instead.

The key is everything the trace reads: the torch-level graph (its nodes, their
targets as ``ref_pickle`` references with Python functions fingerprinted, the
metadata the trace copies, its constants' values), each example input's type,
geometry, dtype, device and requires_grad, the path asked for (training or not, the
requires_grad pattern, aliases, version partners, the grad mode at entry), the op set,
the global switches that pick decompositions (deterministic algorithms, scaled-dot-
product backends, the default dtype, the GPU's compute capability), kiln's sources,
the torch and Python versions and kiln's settings. Symbolic traces, custom op sets and
graphs with large constants are not cached; an entry that does not load is a miss.
"""
from __future__ import annotations

import dataclasses
import io
import pickle
import sys

import torch
import torch.fx as fx

from kiln import config, disk_cache
from kiln import ref_pickle as R
from kiln.debug.logs import log_for

_log = log_for("cache")
KIND = "aot_trace"
#: Bumped when the layout of an entry changes.
FORMAT = 1
#: Constants above this many bytes in all make a graph uncacheable.
MAX_CONSTANT_BYTES = 1 << 20
stats = {"hits": 0, "misses": 0, "stored": 0, "uncacheable": 0}


def _switches(examples) -> str:
    parts = [torch.are_deterministic_algorithms_enabled(), torch.get_default_dtype()]
    cuda = torch.backends.cuda
    parts += [cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled()]
    if hasattr(cuda, "cudnn_sdp_enabled"):
        parts.append(cuda.cudnn_sdp_enabled())
    for a in examples:
        if isinstance(a, torch.Tensor) and a.device.type == "cuda" and torch.cuda.is_available():
            parts.append(torch.cuda.get_device_capability(a.device))
            break
    return repr(parts)


def _example_key(a, device) -> str:
    if isinstance(a, torch.Tensor):
        return repr((type(a).__qualname__, tuple(a.shape), tuple(a.stride()), a.storage_offset(),
                     a.dtype, str(device), a.requires_grad, a.layout))
    if a is None or type(a) in (bool, int, float, str):
        return f"{type(a).__name__}:{a!r}"
    raise R.Uncacheable(f"an example input of type {type(a).__qualname__}")


def key_of(gm, examples, devices, ops, params: dict) -> str:
    """The entry's key; Uncacheable when the trace may read what it cannot name."""
    from kiln.autograd.ops import PROFILES
    names = [n for n, s in PROFILES.items() if s is ops]
    if not names:
        raise R.Uncacheable("a custom op set")
    total = 0
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            v = gm
            for a in n.target.split("."):
                v = getattr(v, a)
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
    if total > MAX_CONSTANT_BYTES:
        raise R.Uncacheable("constants too large to key")
    data, saver = R.dump(R.Saver, R.graph_record(gm.graph, gm, meta_keys=("kiln_user_line", "stack_trace")),
                         allow_tensors=True)
    return disk_cache.key_of(
        str(FORMAT), disk_cache.sources_hash(), torch.__version__, sys.version, names[0],
        repr(saver.refs), disk_cache.key_of(data.hex()),
        ";".join(_example_key(a, d) for a, d in zip(examples, devices)),
        repr(sorted(params.items(), key=lambda kv: kv[0])), _switches(examples),
        config.settings_key())


# --- entries -------------------------------------------------------------------------------
def _fields(tr) -> dict:
    return {f.name: getattr(tr, f.name) for f in dataclasses.fields(tr) if f.name != "graph"}


def _to_refs(v):
    """Graph nodes inside the bookkeeping (``copied``) as NodeRefs."""
    t = type(v)
    if t is fx.Node:
        return R.NodeRef(v.name)
    if t in (tuple, list, set, frozenset):
        return t(_to_refs(x) for x in v)
    if t is dict:
        return {k: _to_refs(x) for k, x in v.items()}
    return v


def _from_refs(v, env):
    t = type(v)
    if t is R.NodeRef:
        return env[v.name]
    if t in (set, frozenset):
        # ``copied`` was gathered before dead code went: a node no longer in the graph
        # is never looked up in it
        return t(_from_refs(x, env) for x in v if type(x) is not R.NodeRef or x.name in env)
    if t in (tuple, list):
        return t(_from_refs(x, env) for x in v)
    if t is dict:
        return {k: _from_refs(x, env) for k, x in v.items()}
    return v


def record_of(tr) -> bytes:
    nodes = R.graph_record(tr.graph)
    f = io.BytesIO()
    saver = R.Saver(f, allow_tensors=True)
    try:
        saver.dump({"graph": nodes, "fields": _to_refs(_fields(tr))})
    except R.Uncacheable:
        raise
    except Exception as e:  # noqa: BLE001 -- anything pickle refuses
        raise R.Uncacheable(f"{type(e).__name__}: {e}") from None
    return pickle.dumps({"refs": saver.refs, "body": f.getvalue()}, protocol=pickle.HIGHEST_PROTOCOL)


def _trace_from(raw: bytes):
    from kiln.autograd.trace import TraceResult
    rec = pickle.loads(raw)
    objs = R.resolve_refs(rec["refs"])
    body = R.load(rec["body"], objs)
    graph = R.graph_from(body["graph"])
    env = {n.name: n for n in graph.nodes}
    return TraceResult(graph=graph, **_from_refs(body["fields"], env))


def traced(run, gm, examples, devices, ops, **params):
    """``run()`` (the trace), or its result as a process with the same key stored it."""
    if not config.trace_cache:
        return run()
    try:
        key = key_of(gm, examples, devices, ops, params)
    except Exception as e:  # noqa: BLE001 -- Uncacheable, or a target pickle refuses
        stats["uncacheable"] += 1
        _log.info("aot trace cache: not cached: %s: %s", type(e).__name__, e)
        return run()
    got = disk_cache.read_entry(KIND, key, ".pkl")
    if got is not None:
        try:
            tr = _trace_from(got[1])
            stats["hits"] += 1
            _log.info("aot trace cache: hit")
            return tr
        except R.Stale as e:
            _log.info("aot trace cache: an entry does not apply: %s", e)
        except Exception as e:  # noqa: BLE001 -- an entry that does not load is a miss
            disk_cache.reject(got[0], f"does not load: {type(e).__name__}: {e}")
    stats["misses"] += 1
    tr = run()
    if hasattr(tr, "graph"):                 # not an _Eager path
        try:
            disk_cache.write_entry(KIND, key, ".pkl", record_of(tr))
            stats["stored"] += 1
        except R.Uncacheable as e:
            stats["uncacheable"] += 1
            _log.info("aot trace cache: not storing: %s", e)
        except (OSError, pickle.PicklingError, TypeError, AttributeError) as e:
            _log.info("aot trace cache: cannot store: %s", e)
    return tr
