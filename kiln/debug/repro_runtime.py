"""What a minifier repro does when it runs, shared by ``repro.py`` files and by the
minifier's own test of each candidate graph (so what it tested is what the file runs).

An input is described by a *spec*: ``("tensor", shape, stride, dtype, device,
requires_grad)``, ``("value", v)`` for a Python value, ``("tuple", [specs])``. Tensors
are random (fixed seed) in the recorded geometry; integer tensors hold small
non-negative values, which stay valid as indices of most dims.

``outcome(stage, gm, specs, ...)`` runs the graph eagerly and through the stage, with
``suppress_errors`` off so that kiln's eager fallbacks do not hide the failure:

- "capture": ``backend(gm, inputs)`` (a named backend) and its result on the inputs;
- "autograd": ``kiln.kernels.compile_aten_graph`` on the aten graph, then a call;
- "kernels": ``kiln.kernels.compile.build`` for the recorded target, its Runtime called
  directly.
"""
from __future__ import annotations

import sys

import torch
from torch.utils import _pytree as pytree

STAGES = ("capture", "autograd", "kernels")
LEVELS = ("error", "accuracy")

#: (rtol, atol) per floating dtype; other dtypes compare exactly
TOLERANCE = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2),
             torch.float32: (1e-3, 1e-4), torch.float64: (1e-7, 1e-9)}


def spec_of(v):
    """The spec of one input value (what a repro regenerates)."""
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), tuple(v.stride()), str(v.dtype).replace("torch.", ""),
                str(v.device), bool(v.requires_grad and v.is_leaf))
    if isinstance(v, (tuple, list)):
        return ("tuple", [spec_of(x) for x in v])
    return ("value", v)


def rand_strided(shape, stride, dtype, device, requires_grad=False):
    """A random tensor with exactly this geometry (its storage just large enough)."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if device == "meta":
        device = "cpu"
    numel = 1 + sum((s - 1) * st for s, st in zip(shape, stride)) if all(shape) else 0
    if dtype.is_floating_point or dtype.is_complex:
        base = torch.randn(numel, dtype=dtype, device=device)
    elif dtype is torch.bool:
        base = torch.randint(0, 2, (numel,), device=device).bool()
    else:
        base = torch.randint(0, 3, (numel,), device=device).to(dtype)
    t = torch.as_strided(base, shape, stride)
    if requires_grad:
        t = t.detach().requires_grad_(True)
    return t


def make_inputs(specs, seed: int = 0) -> list:
    torch.manual_seed(seed)
    return [_make(s) for s in specs]


def _make(spec):
    kind = spec[0]
    if kind == "tensor":
        return rand_strided(*spec[1:])
    if kind == "tuple":
        return tuple(_make(s) for s in spec[1])
    return spec[1]


def copy_inputs(values) -> list:
    """Copies that keep each tensor's geometry and requires_grad (leaves stay leaves)."""
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            c = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
            with torch.no_grad():
                c.copy_(v)
            out.append(c.requires_grad_(v.requires_grad) if v.is_leaf or not v.requires_grad
                       else c)
        elif isinstance(v, (tuple, list)):
            out.append(type(v)(copy_inputs(v)))
        else:
            out.append(v)
    return out


def compiled_callable(stage: str, gm, inputs, backend=None, target=None):
    """The stage under test, compiling ``gm`` for ``inputs``."""
    from kiln import config
    with config.patch(suppress_errors=False):
        if stage == "capture":
            from kiln.backends import lookup_backend
            return lookup_backend(backend or "kiln")(gm, inputs)
        if stage == "autograd":
            from kiln.kernels.compile import CompiledGraph
            return CompiledGraph(gm, inputs)
        if stage == "kernels":
            from kiln.kernels.compile import build, pick_target
            rt, _ = build(gm, inputs, target or pick_target(inputs))
            return rt
    raise ValueError(f"unknown repro stage {stage!r}; known: {', '.join(STAGES)}")


def call_compiled(fn, inputs):
    from kiln import config
    with config.patch(suppress_errors=False):
        return fn(*inputs)


def difference(expected, got) -> str | None:
    """Why ``got`` is not ``expected`` (nested outputs; a list and a tuple of the same
    items agree, as backends may return either), or None when they agree."""
    e_leaves = pytree.tree_leaves(expected)
    g_leaves = pytree.tree_leaves(got)
    if len(e_leaves) != len(g_leaves):
        return f"eager returns {len(e_leaves)} values, compiled {len(g_leaves)}"
    for i, (e, g) in enumerate(zip(e_leaves, g_leaves)):
        if isinstance(e, torch.Tensor) != isinstance(g, torch.Tensor):
            return f"output {i}: eager {type(e).__name__}, compiled {type(g).__name__}"
        if not isinstance(e, torch.Tensor):
            if e != g and not (e != e and g != g):
                return f"output {i}: eager {e!r}, compiled {g!r}"
            continue
        if e.shape != g.shape or e.dtype != g.dtype:
            return (f"output {i}: eager {tuple(e.shape)} {e.dtype}, "
                    f"compiled {tuple(g.shape)} {g.dtype}")
        e, g = e.detach().cpu(), g.detach().cpu()
        rtol, atol = TOLERANCE.get(e.dtype, (0.0, 0.0))
        if e.is_floating_point() or e.is_complex():
            ok = torch.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
        else:
            ok = torch.equal(g, e)
        if not ok:
            err = (g.double() - e.double()).abs().nan_to_num(float("inf")).max().item() \
                if e.numel() else 0.0
            return f"output {i} ({tuple(e.shape)} {e.dtype}): max abs difference {err:g}"
    return None


def outcome(stage, level, gm, specs, backend=None, target=None, seed=0):
    """(kind, detail): ("ok", None), ("error", exception), ("inaccurate", text) or
    ("eager_error", exception) — the graph raises eagerly too, so kiln is not at fault."""
    inputs = make_inputs(specs, seed)
    ref_inputs = copy_inputs(inputs)
    rng = torch.get_rng_state()
    try:
        expected = gm(*ref_inputs)
    except Exception as e:  # noqa: BLE001 -- reported as the outcome
        return "eager_error", e
    after = torch.get_rng_state()
    torch.set_rng_state(rng)
    try:
        fn = compiled_callable(stage, gm, inputs, backend, target)
        got = call_compiled(fn, inputs)
    except Exception as e:  # noqa: BLE001 -- reported as the outcome
        return "error", e
    finally:
        torch.set_rng_state(after)
    if level == "accuracy":
        why = difference((expected, ref_inputs), (got, inputs))
        if why is not None:
            return "inaccurate", why
    return "ok", None


def run(gm, specs, stage, level, backend=None, target=None, expected=None, settings=None):
    """The body of a ``repro.py``: raises (exits non-zero) when the failure reproduces."""
    from kiln import config
    with config.patch(**(settings or {})):
        return _run(gm, specs, stage, level, backend, target, expected)


def _run(gm, specs, stage, level, backend, target, expected):
    print(f"kiln repro: {stage} stage, {level} level, "
          f"{sum(1 for n in gm.graph.nodes if n.op in ('call_function', 'call_method'))} op(s)")
    if expected:
        print(f"originally: {expected}")
    kind, detail = outcome(stage, level, gm, specs, backend, target)
    if kind == "error":
        print(f"REPRODUCED: {type(detail).__name__}", file=sys.stderr)
        raise detail
    if kind == "inaccurate":
        raise AssertionError(f"REPRODUCED: kiln's result differs from eager's: {detail}")
    if kind == "eager_error":
        print(f"the graph fails eagerly too ({type(detail).__name__}: {detail}); "
              "not reproduced")
        return 2
    print("not reproduced: compiled and eager agree")
    return 0
