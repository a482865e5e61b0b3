"""A failing case as a standalone script: ``repro_<seed>_<mode>.py``.

The script holds the program's source, loads it twice (eager and compiled, each with
its own module state), makes each call's inputs from the same seeds as the fuzzer,
runs both, and then asserts exactly the facts the fuzzer found different — written out
as plain expressions over the two runs (``E["out"][0].dtype == C["out"][0].dtype``).
It needs torch and kiln only (and torch.compile for a torch mode).
"""
from __future__ import annotations

import os
import re

from .compare import GRAD_TOL, TOLERANCE, Mismatch, tolerance
from .modes import Mode
from .program import INPUT_SEEDS, Program
from .runner import CaseResult

_PRELUDE = '''
import traceback

import torch
{imports}

SOURCE = {source}
TRAIN = {train}
CLONE = {clone}
TOLERANCE = {{{tolerance}}}
GRAD_TOLERANCE = {grad_tol}


def load(graph_break):
    ns = {{"__name__": "fuzzprog", "graph_break": graph_break}}
    exec(compile(SOURCE, "<fuzzprog>", "exec"), ns)
    return ns


def backward(out, call):
    outs, seen = [], set()

    def walk(o):
        if isinstance(o, torch.Tensor):
            if o.requires_grad and o.is_floating_point() and id(o) not in seen:
                seen.add(id(o))
                outs.append(o)
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)
        elif isinstance(o, dict):
            for x in o.values():
                walk(x)

    walk(out)
    if outs:
        g = torch.Generator().manual_seed(1000 + call)
        grads = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype) for o in outs]
        torch.autograd.backward(outs, grads)


def run(ns, fn, call):
    g = torch.Generator().manual_seed({seeds}[call])
    args, bases, leaves = ns["make_inputs"](g, TRAIN, CLONE)
    r = dict(ns=ns, args=args, bases=bases, leaves=leaves, out=None, exc=None, backward_exc=None)
    torch.set_grad_enabled(True)
    try:
        r["out"] = fn(*args)
    except Exception as e:
        r["exc"] = e
    r["grad_mode"] = torch.is_grad_enabled()
    torch.set_grad_enabled(True)
    if TRAIN and r["exc"] is None:
        try:
            backward(r["out"], call)
        except Exception as e:
            r["backward_exc"] = e
    return r


def close(a, b, grad=False):
    a, b = a.detach(), b.detach()
    rtol, atol = TOLERANCE.get(a.dtype, (0.0, 0.0))
    if grad and a.dtype.is_floating_point:
        rtol, atol = max(rtol, GRAD_TOLERANCE[0]), max(atol, GRAD_TOLERANCE[1])
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return bool(torch.isclose(b, a, rtol=rtol, atol=atol, equal_nan=True).all())
    return bool((a == b).all())


def same_storage(a, b):
    return a.untyped_storage().nbytes() > 0 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def norm_strides(t):
    return tuple(s for s, n in zip(t.stride(), t.shape) if n != 1), t.storage_offset()


FAILED = []


def check(ok, what, eager, compiled):
    if not ok:
        FAILED.append(f"{{what}}\\n    eager:    {{eager!r}}\\n    compiled: {{compiled!r}}")


E_NS = load(lambda: None)
C_NS = load({graph_break})
COMPILED = {compile}(C_NS["prog"]{backend})
'''

_CALLS = '''
PREV = None
for call in range({ncalls}):
    E = run(E_NS, E_NS["prog"], call)
    C = run(C_NS, COMPILED, call)
    if C["exc"] is not None and E["exc"] is None:
        traceback.print_exception(C["exc"])
{checks}
    PREV = (E, C)

if FAILED:
    raise AssertionError("compiled differs from eager:\\n" + "\\n".join(FAILED))
print("not reproduced: compiled matches eager on every checked fact")
'''

_IMPORTS = {
    "kiln": ("import kiln", "kiln.graph_break", "kiln.compile"),
    "torch": ("import torch._dynamo", "torch._dynamo.graph_break", "torch.compile"),
}


def path_expr(path: str, side: str) -> str:
    """The expression for a fuzzer path (``out[0]['a'].t``, ``G_c3.cell0``,
    ``grads[1]``) over one run's dict ``side`` (``E`` or ``C``)."""
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(.*)$", path)
    root, rest = m.group(1), m.group(2)
    rest = re.sub(r"\.cell(\d+)", r".__closure__[\1].cell_contents", rest)
    if root == "grads":
        m2 = re.match(r"\[(\d+)\](.*)$", rest)
        return f'{side}["leaves"][{m2.group(1)}].grad{m2.group(2)}'
    if root == "stale":
        return f'PREV[{0 if side == "E" else 1}]["out"]{rest}'
    if root in ("out", "args", "bases"):
        return f'{side}["{root}"]{rest}'
    return f'{side}["ns"]["{root}"]{rest}'


def _facet_check(m: Mismatch) -> str:
    e, c = path_expr(m.path, "E") if m.path else "", path_expr(m.path, "C") if m.path else ""
    what = repr(f"{m.where}/{m.facet} at {m.path or '-'}")
    if m.where == "exception":
        return f'check(type(E["exc"]) is type(C["exc"]), {what}, E["exc"], C["exc"])'
    if m.where == "backward":
        return f'check(type(E["backward_exc"]) is type(C["backward_exc"]), {what}, E["backward_exc"], C["backward_exc"])'
    if m.where == "grad_mode":
        return f'check(E["grad_mode"] == C["grad_mode"], {what}, E["grad_mode"], C["grad_mode"])'
    if m.facet in ("alias", "identity"):
        e2, c2 = path_expr(m.other, "E"), path_expr(m.other, "C")
        rel = "same_storage({}, {})" if m.facet == "alias" else "({} is {})"
        return (f"check({rel.format(e, e2)} == {rel.format(c, c2)}, {what} + ' with {m.other}', "
                f"{rel.format(e, e2)}, {rel.format(c, c2)})")
    table = {
        "values": (f"close({e}, {c}, grad={m.where == 'grad'})", f"{e}", f"{c}"),
        "dtype": (f"{e}.dtype == {c}.dtype", f"{e}.dtype", f"{c}.dtype"),
        "shape": (f"{e}.shape == {c}.shape", f"{e}.shape", f"{c}.shape"),
        "layout": (f"{e}.layout == {c}.layout", f"{e}.layout", f"{c}.layout"),
        "requires_grad": (f"{e}.requires_grad == {c}.requires_grad", f"{e}.requires_grad", f"{c}.requires_grad"),
        "is_leaf": (f"{e}.is_leaf == {c}.is_leaf", f"{e}.is_leaf", f"{c}.is_leaf"),
        "strides": (f"norm_strides({e}) == norm_strides({c})", f"({e}.stride(), {e}.storage_offset())",
                    f"({c}.stride(), {c}.storage_offset())"),
        "contiguity": (f"{e}.is_contiguous() == {c}.is_contiguous()", f"{e}.stride()", f"{c}.stride()"),
        "grad": (f"({e} is None) == ({c} is None)", f"{e}", f"{c}"),
        "type": (f"type({e}) is type({c})", f"type({e})", f"type({c})"),
        "length": (f"len({e}) == len({c})", f"len({e})", f"len({c})"),
        "keys": (f"list({e}) == list({c})", f"list({e})", f"list({c})"),
        "attributes": (f"list(vars({e})) == list(vars({c}))", f"list(vars({e}))", f"list(vars({c}))"),
        "missing": (f'("{m.path}" in E["ns"]) == ("{m.path}" in C["ns"])', "", ""),
    }
    cond, ev, cv = table.get(m.facet, (f"{e} == {c}", e, c))
    return f"check({cond}, {what}, {ev or None}, {cv or None})"


def _checks(mismatches: list[Mismatch], limit: int = 6) -> str:
    """The checks, each under ``if call == K`` (a stale-output check runs one call later)."""
    lines = []
    for m in mismatches[:limit]:
        call = m.call + 1 if m.path.startswith("stale") else m.call
        lines.append(f"    if call == {call}:\n        {_facet_check(m)}")
    return "\n".join(lines) or "    pass"


def repro_text(program: Program, mode: Mode, result: CaseResult) -> str:
    imports, gb, comp = _IMPORTS[mode.compiler]
    backend = f', backend="{mode.backend}"'
    listed = "\n".join(f"  {m}" for m in result.mismatches[:12])
    more = f"\n  ... and {len(result.mismatches) - 12} more" if len(result.mismatches) > 12 else ""
    doc = (f'"""Fuzz reproducer: seed {program.seed}, mode {mode.name} ({mode.compiler}, backend '
           f'{mode.backend}, train={mode.train}): {result.status}.\n\n'
           f"Differences the fuzzer found:\n{listed or '  (none recorded)'}{more}\n")
    if result.error:
        doc += "\nError:\n" + "\n".join("  " + ln for ln in result.error.replace('"""', "'''").splitlines()) + "\n"
    doc += '\nRun from the kiln repository root: PYTHONPATH=. python THIS_FILE\n"""\n'
    tol = ", ".join(f"{dt}: {tolerance(dt, program.uses_half)}" for dt in TOLERANCE)
    src = program.source
    source = f"r'''\n{src}'''" if "'''" not in src and "\\" not in src else repr(src)
    body = _PRELUDE.format(imports=imports, source=source, train=mode.train,
                           clone=program.train_inputs == "clone", tolerance=tol, grad_tol=GRAD_TOL, seeds=INPUT_SEEDS,
                           graph_break=gb, compile=comp, backend=backend)
    calls = _CALLS.format(ncalls=len(INPUT_SEEDS), checks=_checks(result.mismatches))
    return doc + body + calls


def write_repro(out_dir: str, program: Program, mode: Mode, result: CaseResult) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"repro_{program.seed}_{mode.name}.py")
    with open(path, "w") as f:
        f.write(repro_text(program, mode, result))
    return path
