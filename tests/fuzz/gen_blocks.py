"""Compound statements (branches on Python and tensor values, loops, grad-mode blocks,
try/except) and the rule tables the generator draws statements from.

A branch's bodies are each generated and run on their own copy of the state, so the
branch not taken with today's inputs is known to run too; both must leave every
existing local with the same type, shape and dtype, and a value made in both (one
per branch) is merged under one name.
"""
from __future__ import annotations

import torch

from . import gen_stmts as S
from .gen_exprs import _factor, _shape_arg
from .gen_state import block, signature

MAX_DEPTH = 2


def _indent(text: str) -> str:
    return "\n".join("    " + ln if ln else ln for ln in text.splitlines())


def _compound(parts, defines=(), features=(), extra_writes=()) -> "S.Block":
    """A block from (head line, body blocks) parts; body-less parts are plain lines."""
    lines, header, writes, feats = [], [], set(extra_writes), set(features)
    for head, blocks in parts:
        lines.append(head)
        for b in blocks or ():
            lines.append(_indent(b.text))
            header.extend(b.header)
            writes |= b.global_writes
            feats |= b.features
    return block("\n".join(lines), defines=defines, global_writes=writes, header=header, features=feats)


def _new_names(body, pre: dict) -> list[str]:
    return [n for n in body.sig if n not in pre]


def _py_cond(g) -> str | None:
    rng = g.rng
    opts = ["torch.is_grad_enabled()"]
    t = g.tensor()
    if t is not None:
        v = g.value(t)
        opts += [f"{t}.dim() == {v.dim()}", f"{t}.numel() > 4", f"{t}.dtype == torch.float32",
                 f"{t}.is_contiguous()", f"{t}.requires_grad"]
        if v.dim():
            opts += [f"{t}.shape[0] > 1", f"{t}.size(-1) == {v.shape[-1]}"]
    for s in g.locals_of((int, float, bool))[-3:]:
        opts += [f"{s} > 1", f"not {s}"]
    for l in g.locals_of(list)[-2:]:
        opts.append(f"len({l}) > 1")
    for name in g.st.ns:
        if name.startswith(("G_f", "G_n")):
            opts.append(name if name.startswith("G_f") else f"{name} % 2 == 0")
    return rng.choice(opts)


def _tensor_cond(g) -> str | None:
    t = g.tensor()
    if t is None:
        return None
    return g.rng.choice([
        f"{t}.sum() > 0", f"({t} > 0).any()", f"{t}.float().mean() > 0.1", f"{t}.max() > 1", f"{t}.all()",
        f"{t}.flatten()[0] > 0", f"{t}.sum().item() > 0", f"{t}.float().norm() < 3",
    ])


def _if(g, cond_fn, feature):
    if g.depth >= MAX_DEPTH:
        return None
    cond = cond_fn(g)
    if cond is None:
        return None
    try:
        bool(g.st.eval(cond))
    except Exception:
        return None
    rng = g.rng
    pre = dict(_sig(g))
    then = g.gen_body(BODY_RULES, rng.randint(1, 3))
    if then is None:
        return None
    other = g.gen_body(BODY_RULES, rng.randint(1, 3)) if rng.random() < 0.6 else None
    other_sig = other.sig if other else pre
    if any(then.sig.get(n) != other_sig.get(n) for n in pre):
        return None
    defines = []
    if other is not None:
        a = [n for n in _new_names(then, pre) if isinstance(then.sig[n], tuple) and then.sig[n][0] is torch.Tensor]
        b = [n for n in _new_names(other, pre) if n not in then.sig]
        pair = next(((x, y) for x in a for y in b if then.sig[x] == other.sig[y]), None)
        if pair is not None:
            m = g.fresh("v")
            then.blocks.append(block(f"{m} = {pair[0]}"))
            other.blocks.append(block(f"{m} = {pair[1]}"))
            defines.append(m)
    parts = [(f"if {cond}:", then.blocks)]
    if other is not None:
        parts.append(("else:", other.blocks))
    return _compound(parts, defines, features=[feature])


def _sig(g):
    return signature(g.st)


def if_py(g):
    return _if(g, _py_cond, "if_python")


def if_tensor(g):
    return _if(g, _tensor_cond, "if_tensor")


def for_loop(g):
    if g.depth >= MAX_DEPTH:
        return None
    rng = g.rng
    pre = dict(_sig(g))
    r = rng.random()
    lists = g.locals_of(list, lambda l: l and all(isinstance(u, torch.Tensor) for u in l))
    dicts = g.locals_of(dict, lambda d: d and all(isinstance(u, torch.Tensor) for u in d.values()))
    if r < 0.25 and lists:
        u, l = g.fresh("u"), lists[-1]
        head, setup, names = f"for {u} in {l}:", f"{u} = {l}[0]", [u]
    elif r < 0.35 and dicts:
        k, u, d = g.fresh("k"), g.fresh("u"), dicts[-1]
        head, setup, names = f"for {k}, {u} in {d}.items():", f"{k}, {u} = next(iter({d}.items()))", [k, u]
    elif r < 0.45 and lists:
        i, u, l = g.fresh("i"), g.fresh("u"), lists[-1]
        head, setup, names = f"for {i}, {u} in enumerate({l}):", f"{i}, {u} = 0, {l}[0]", [i, u]
    else:
        i = g.fresh("i")
        head, setup, names = f"for {i} in range({rng.randint(1, 3)}):", f"{i} = 0", [i]
    body = g.gen_body(BODY_RULES, rng.randint(1, 3), setup=setup, setup_defines=names)
    if body is None:
        return None
    return _compound([(head, body.blocks)], [n for n in _new_names(body, pre)], features=["loop"])


def while_loop(g):
    if g.depth >= MAX_DEPTH:
        return None
    rng = g.rng
    c = g.fresh("c")
    t = g.tensor(lambda v: v.is_floating_point() and v.numel() > 0)
    if t is not None and rng.random() < 0.5:
        cond = f"{t}.abs().sum() > {rng.choice(['0.5', '2', '5'])} and {c} < 3"
        feature = "while_tensor"
    else:
        cond = f"{c} < {rng.randint(1, 3)}"
        feature = "while_python"
    body = g.gen_body(BODY_RULES, rng.randint(1, 2), setup=f"{c} = 1", setup_defines=[c])
    if body is None:
        return None
    return _compound([(f"{c} = 0", None), (f"while {cond}:", [block(f"{c} += 1")] + body.blocks)], [c],
                     features=[feature])


def with_grad(g):
    if g.depth >= MAX_DEPTH:
        return None
    rng = g.rng
    pre = dict(_sig(g))
    flags = g.locals_of(bool)
    ctx = rng.choice(["torch.no_grad()", "torch.no_grad()", "torch.enable_grad()",
                      "torch.set_grad_enabled(False)"] + [f"torch.set_grad_enabled({f})" for f in flags[-1:]])
    body = g.gen_body(BODY_RULES_IN_GRAD, rng.randint(1, 3))
    if body is None:
        return None
    return _compound([(f"with {ctx}:", body.blocks)], _new_names(body, pre), features=["grad_block"])


def try_except(g):
    rng = g.rng
    t = g.tensor()
    if t is None:
        return None
    v = g.value(t)
    n = g.fresh("v")
    shape = _shape_arg(_factor(g, v.numel()))
    u = g.tensor()
    opts = [
        f"try:\n    {n} = {t}.view({shape})\nexcept RuntimeError:\n    {n} = {t}.reshape({shape})",
        f"try:\n    if {t}.sum() > 0:\n        raise ValueError('positive')\n    {n} = {t} * 2\n"
        f"except ValueError:\n    {n} = {t} + 1",
        f"try:\n    {n} = {t} + {u}\nexcept RuntimeError:\n    {n} = {t}",
    ]
    return block(rng.choice(opts), defines=[n], features=["try"])


def deliberate_raise(g):
    """A user exception out of ``prog`` on some inputs (exception parity: the compiled
    run must raise the same type, with the same state changes made before it)."""
    cond = _tensor_cond(g) if g.rng.random() < 0.7 else _py_cond(g)
    if cond is None:
        return None
    return block(f"if {cond}:\n    raise ValueError('deliberate')", features=["raise"])


BODY_RULES = [
    (30, S.assign), (12, S.inplace), (4, S.scalar), (5, S.container), (4, S.global_state), (1, S.objects),
    (2, S.closure), (3, S.grad_stmt), (8, S.graph_break_stmt), (3, if_py), (3, if_tensor), (3, for_loop),
    (3, with_grad),
]
BODY_RULES_IN_GRAD = BODY_RULES + [(6, S.graph_break_stmt)]

TOP_RULES = [
    (30, S.assign), (12, S.inplace), (6, S.scalar), (6, S.container), (4, S.global_state), (3, S.objects),
    (3, S.closure), (3, S.grad_stmt), (5, S.graph_break_stmt), (5, if_py), (6, if_tensor), (5, for_loop),
    (2, while_loop), (5, with_grad), (2, try_except),
]
