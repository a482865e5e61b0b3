"""Tensor expressions: tables of op templates by family, filled from live operands.

Every template is tried on the live values before it is used, so a table need not
know which dtypes an op accepts: a template that raises (``~`` on a float tensor,
``mean`` of an int tensor) is simply tried with another op. ``expr`` returns the text
and the value it evaluates to.
"""
from __future__ import annotations

import torch

from .gen_state import MAX_NDIM, MAX_NUMEL, atom

UNARY = [
    (3, "torch.relu({x})"), (2, "{x}.abs()"), (1, "torch.neg({x})"), (2, "-{x}"),
    (1, "torch.exp({x})"), (1, "{x}.sin()"), (1, "torch.cos({x})"), (2, "torch.tanh({x})"),
    (2, "torch.sigmoid({x})"), (1, "{x}.sqrt()"), (1, "torch.log1p({x}.abs())"),
    (1, "{x}.floor()"), (1, "torch.ceil({x})"), (1, "{x}.round()"), (1, "torch.sign({x})"),
    (1, "{x}.square()"), (1, "torch.erf({x})"), (1, "torch.reciprocal({x})"), (1, "{x}.rsqrt()"),
    (1, "torch.trunc({x})"), (1, "F.gelu({x})"), (1, "F.silu({x})"), (1, "F.softplus({x})"),
    (1, "F.leaky_relu({x}, 0.1)"), (1, "F.elu({x})"), (1, "F.hardtanh({x})"),
    (2, "{x}.clamp(min=-0.5, max=0.5)"), (1, "{x}.clamp(min=0)"), (1, "torch.clamp({x}, max=1)"),
    (1, "torch.nan_to_num({x})"), (3, "{x} * 2"), (3, "{x} + 1"), (2, "{x} - 0.5"), (1, "{x} / 3"),
    (1, "{x} ** 2"), (1, "{x} // 2"), (1, "{x} % 3"), (1, "2 * {x}"), (1, "1 - {x}"),
    (2, "{x}.float()"), (1, "{x}.double()"), (1, "{x}.long()"), (1, "{x}.bool()"),
    (0.3, "{x}.to(torch.float16)"), (0.2, "{x}.half()"), (0.2, "{x}.bfloat16()"), (0.3, "{x}.int()"),
    (0.5, "{x}.to(torch.float32)"), (2, "{x}.clone()"), (1, "{x}.contiguous()"), (1, "{x}.detach()"),
    (1, "torch.logical_not({x})"), (1, "~{x}"), (0.5, "{x}.isnan()"), (0.5, "torch.isfinite({x})"),
    (1, "torch.where({x} > 0, {x}, 0.0)"), (0.5, "torch.expm1({x})"), (1, "torch.log({x}.abs() + 1)"),
    (0.3, "{x}.frac()"), (1, "{x}.mul(0.5)"), (0.5, "{x}.add(1, alpha=2)"), (0.5, "torch.zeros_like({x})"),
    (0.3, "torch.ones_like({x}, dtype=torch.float32)"), (0.3, "torch.full_like({x}, 2)"),
    (0.2, "{x}.new_ones({x}.shape)"), (0.2, "{x}.new_zeros(3)"), (0.3, "torch.bitwise_not({x})"),
    (0.5, "{x} == 0"), (1, "{x} > 0"), (0.5, "{x} <= 0.5"), (0.3, "{x}.ne(1)"),
    (0.5, "F.normalize({x}, dim=-1)"), (0.3, "{x}.masked_fill({x} < 0, 0)"), (0.3, "torch.fmod({x}, 1.5)"),
    (0.3, "torch.remainder({x}, 2)"), (0.3, "{x}.type_as(torch.ones(1))"),
]

BINARY = [
    (5, "{x} + {y}"), (3, "{x} - {y}"), (5, "{x} * {y}"), (2, "{x} / {y}"), (1, "torch.add({x}, {y})"),
    (1, "torch.mul({x}, {y})"), (1, "{x}.sub({y})"), (1, "torch.maximum({x}, {y})"),
    (1, "torch.minimum({x}, {y})"), (0.5, "torch.atan2({x}, {y})"), (1, "{x} > {y}"), (0.5, "{x} == {y}"),
    (0.5, "torch.lt({x}, {y})"), (0.5, "{x} & {y}"), (0.5, "{x} | {y}"), (0.3, "{x} ^ {y}"),
    (0.5, "torch.logical_and({x}, {y})"), (1, "torch.where({x} > 0, {x}, {y})"),
    (0.5, "torch.lerp({x}, {y}, 0.25)"), (0.5, "torch.add({x}, {y}, alpha=2)"),
    (0.3, "torch.copysign({x}, {y})"), (0.3, "torch.hypot({x}, {y})"), (0.3, "torch.logaddexp({x}, {y})"),
    (0.5, "{x} ** {y}"), (0.3, "torch.pow({x}.abs(), {y})"), (0.3, "torch.addcmul({x}, {x}, {y}, value=0.5)"),
    (0.5, "{x}.masked_fill({y} > 0, 0.0)"), (0.3, "torch.clamp({x}, min={y})"), (0.3, "{x} // {y}"),
]

LITERALS = [(3, "2"), (3, "0.5"), (2, "-1"), (2, "1.5"), (1, "3"), (0.5, "True"), (1, "0"), (0.5, "-2.5")]


def _pick(g, table):
    return g.rng.choices([t for _, t in table], weights=[w for w, _ in table])[0]


def _bcast(a, b) -> bool:
    try:
        torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


def operand(g, depth: int, pred=None):
    """(text, value) of a tensor: a local, or (depth permitting) a subexpression."""
    if depth > 0 and g.rng.random() < 0.3:
        r = expr(g, depth - 1)
        if r is not None and (pred is None or pred(r[1])):
            return atom(r[0]), r[1]
    name = g.tensor(pred)
    return (name, g.value(name)) if name else None


def partner(g, x, depth: int) -> str | None:
    """A second operand for ``x``: a literal, a Python scalar local, a tensor that
    broadcasts with ``x``, a 0-d tensor, or a reduction of ``x`` kept broadcastable."""
    rng = g.rng
    r = rng.random()
    xv = x[1]
    if r < 0.22:
        return _pick(g, LITERALS)
    if r < 0.3:
        s = g.pick(g.locals_of((int, float)))
        if s is not None:
            return s
    if r < 0.36:
        return rng.choice(["torch.tensor(2.0)", "torch.tensor(3)", "torch.tensor(-0.5, dtype=torch.float64)"])
    if r < 0.42 and xv.dim() >= 1:
        return f"{x[0]}.sum(-1, keepdim=True)"
    y = operand(g, depth, lambda v: _bcast(v.shape, xv.shape))
    return y[0] if y else None


# ---------------------------------------------------------------- families

def unary(g, x, depth):
    return _pick(g, UNARY).format(x=x[0])


def binary(g, x, depth):
    y = partner(g, x, depth)
    if y is None:
        return None
    if g.rng.random() < 0.2:  # the Python scalar or literal on the left
        x, y = (y, None), x
        return _pick(g, BINARY[:4]).format(x=atom(x[0]), y=y[0])
    return _pick(g, BINARY).format(x=x[0], y=atom(y))


def _dims(g, t, k):
    nd = max(t.dim(), 1)
    ds = g.rng.sample(range(nd), min(k, nd))
    return ", ".join(str(d) for d in ds)


def reduction(g, x, depth):
    t, v = x
    d = g.dim(v)
    ds = _dims(g, v, 2)
    return g.rng.choice([
        f"{t}.sum()", f"{t}.sum({d})", f"{t}.sum({d}, keepdim=True)", f"{t}.sum(dim=({ds},))",
        f"torch.sum({t}, {d}, dtype=torch.float64)", f"{t}.mean()", f"{t}.mean({d})",
        f"{t}.float().mean({d}, keepdim=True)", f"{t}.amax({d})", f"{t}.amin()", f"torch.max({t})",
        f"{t}.max({d}).values", f"{t}.max({d})[1]", f"{t}.min({d}, keepdim=True).indices", f"{t}.argmax()",
        f"{t}.argmax({d})", f"torch.argmin({t}, {d}, keepdim=True)", f"{t}.prod({d})",
        f"torch.softmax({t}, {d})", f"F.log_softmax({t}, dim={d})", f"{t}.logsumexp({d})", f"{t}.var({d})",
        f"{t}.std()", f"torch.var({t}, {d}, correction=0)", f"{t}.all()", f"{t}.any({d})", f"{t}.cumsum({d})",
        f"{t}.cumprod({d})", f"{t}.norm()", f"torch.count_nonzero({t})", f"{t}.sum(-1)",
        f"torch.linalg.vector_norm({t}, dim={d})", f"{t}.nansum()", f"torch.mean({t}.float(), dim=[{ds}])",
        f"{t}.amax(dim=({ds},), keepdim=True)", f"F.softmax({t}, dim={d}, dtype=torch.float64)",
    ])


def _factor(g, n: int) -> list[int]:
    """A random shape with ``n`` elements."""
    if n == 0:
        return g.rng.choice([[0], [0, 2], [2, 0]])
    dims = []
    while n > 1 and len(dims) < 3:
        divs = [d for d in range(2, n + 1) if n % d == 0]
        d = g.rng.choice(divs)
        dims.append(d)
        n //= d
    if g.rng.random() < 0.3:
        dims.insert(g.rng.randrange(len(dims) + 1), 1)
    return dims or [1]


def _shape_arg(dims) -> str:
    return ", ".join(str(d) for d in dims)


def _index(g, v) -> str:
    parts = []
    for size in v.shape:
        r = g.rng.random()
        if r < 0.35:
            parts.append(":")
        elif r < 0.5 and size > 0:
            parts.append(str(g.rng.randrange(-size, size)))
        elif r < 0.65:
            parts.append(g.rng.choice(["::2", "1::2", "::3"]))
        elif r < 0.8:
            a = g.rng.randrange(0, max(size, 1))
            parts.append(f"{a}:{a + g.rng.randrange(1, 4)}")
        elif r < 0.88:
            parts.append("-2:")
        else:
            parts.append("None, :")
    if g.rng.random() < 0.15:
        parts = ["..."] + parts[len(parts) // 2:]
    parts = parts[: g.rng.randrange(1, len(parts) + 1)] if parts else [g.rng.choice(["None", "..."])]
    return ", ".join(parts)


def view(g, x, depth):
    t, v = x
    rng = g.rng
    nd = v.dim()
    d = g.dim(v)
    opts = [
        f"{t}.view({_shape_arg(_factor(g, v.numel()))})", f"{t}.reshape({_shape_arg(_factor(g, v.numel()))})",
        f"{t}.view(-1)", f"{t}.flatten()", f"{t}[{_index(g, v)}]", f"{t}.unsqueeze({rng.randrange(-nd - 1, nd + 1)})",
        f"{t}[None]", f"{t}.squeeze()", f"{t}.squeeze({d})", f"{t}.clone()[{_index(g, v)}]",
    ]
    if nd >= 2:
        a, b = rng.sample(range(nd), 2)
        perm = list(range(nd))
        rng.shuffle(perm)
        opts += [f"{t}.transpose({a}, {b})", f"{t}.permute({_shape_arg(perm)})", f"{t}.mT",
                 f"{t}.movedim({a}, {b})", f"{t}.swapaxes({a}, {b})", f"{t}.flatten({min(a, b)}, {max(a, b)})",
                 f"{t}.diagonal()", f"{t}.diagonal({rng.choice([-1, 0, 1])}, {a}, {b})"]
    if nd == 2:
        opts += [f"{t}.t()", f"{t}.T"]
    if nd >= 1:
        size = v.shape[d]
        opts += [f"{t}.split({rng.randint(1, 3)}, {d})[0]", f"torch.chunk({t}, 2, {d})[-1]",
                 f"{t}.unbind({d})[0]" if size else f"{t}.unbind({d})",
                 f"{t}.select({d}, {rng.randrange(size) if size else 0})",
                 f"{t}.narrow({d}, {min(1, size)}, {max(size - 1, 0)})", f"{t}[..., {rng.choice([0, -1])}]",
                 f"{t}.unfold({d}, {min(2, size) or 1}, 1)", f"{t}.tensor_split(2, {d})[0]"]
        big = [i for i, s in enumerate(v.shape) if s == 1]
        shape = [rng.choice([2, 3]) if s == 1 else s for s in v.shape]
        if big:
            opts += [f"{t}.expand({_shape_arg(shape)})", f"torch.broadcast_to({t}, ({_shape_arg(shape)},))"]
        opts += [f"{t}.expand(2, {_shape_arg(v.shape)})", f"{t}.unflatten(0, (1, -1))"]
    else:
        opts += [f"{t}.expand(3)", f"{t}.view(1, 1)"]
    return rng.choice(opts)


def _same_shape(g, v, exclude):
    names = g.locals_of(torch.Tensor, lambda u: u.shape == v.shape and u.dtype == v.dtype)
    names = [n for n in names if n != exclude]
    return g.pick(names)


def misc(g, x, depth):
    t, v = x
    rng = g.rng
    d = g.dim(v)
    other = _same_shape(g, v, t) or rng.choice([t, f"{atom(t)} * 2", f"{t}.flip(0)" if v.dim() else t])
    opts = [
        f"torch.cat([{t}, {other}], {d})", f"torch.stack([{t}, {other}])", f"torch.stack([{t}, {other}], -1)",
        f"{t}.flip({d})", f"torch.roll({t}, 1, {d})", f"{t}.repeat({_shape_arg([2] + [1] * v.dim())})",
        f"{t}[{t} > 0]", f"torch.nonzero({t})", f"{t}.gather({d}, {t}.argmax({d}, keepdim=True))",
        f"torch.sort({t}, {d}, stable=True)[0]", f"torch.sort({t}, {d}, stable=True).indices",
        f"torch.where({t} > 0, {t}, {other})", f"{t}.index_select({d}, torch.tensor([0]))",
        f"{t}[torch.tensor([0, 0])]", f"F.pad({t}, (1, 1))", f"{t}.tril()", f"{t}.triu(1)",
        f"F.layer_norm({t}, {t}.shape[-1:])", f"torch.cumsum({t}, {d}, dtype=torch.float64)",
        f"{t}.scatter({d}, torch.zeros_like({t}, dtype=torch.long), 1.0)",
        f"{t}.index_add(0, torch.tensor([0]), {t}[:1])", f"torch.clamp({t}, {other}, 2)",
        f"torch.diag({t})", f"{t}.unique()", f"torch.outer({t}.flatten(), {t}.flatten()[:3])",
    ]
    return rng.choice(opts)


def matmul(g, x, depth):
    t, v = x
    rng = g.rng
    if not v.is_floating_point() or v.dim() == 0 or v.dim() > 3:
        return None
    dtype = str(v.dtype).replace("torch.", "")
    k = v.shape[-1]
    m = rng.choice([1, 2, 3, 5])
    candidates = []
    for name in g.locals_of(torch.Tensor, lambda u: u.dtype == v.dtype and u.dim() >= 1):
        u = g.value(name)
        inner = u.shape[0] if u.dim() <= 2 else u.shape[-2]
        if inner == k:
            candidates.append(name)
    y = g.pick(candidates) if candidates and rng.random() < 0.5 else None
    if y is None and v.dim() >= 2 and rng.random() < 0.5:
        y = f"{t}.mT"
    if y is None:
        y = rng.choice([f"torch.ones({k}, {m}, dtype=torch.{dtype})",
                        f"(torch.arange({k * m}, dtype=torch.{dtype}).view({k}, {m}) / 7)",
                        f"torch.linspace(-1, 1, {k}, dtype=torch.{dtype})"])
    return rng.choice([
        f"{t} @ {y}", f"torch.matmul({t}, {y})", f"torch.mm({t}, {y})", f"torch.bmm({t}, {y})",
        f"torch.mv({t}, {y})", f"torch.dot({t}, {y})", f"torch.einsum('ij,jk->ik', {t}, {y})",
        f"F.linear({t}, {y}.mT)", f"torch.addmm(torch.ones(1, dtype=torch.{dtype}), {t}, {y})",
    ])


def factory(g, x, depth):
    rng = g.rng
    n = rng.choice([0, 1, 3, 4, 6])
    shape = _shape_arg(_factor(g, rng.choice([1, 2, 4, 6, 12])))
    return rng.choice([
        f"torch.ones({shape})", f"torch.arange({n})", f"torch.arange({n}, dtype=torch.float32)",
        f"torch.linspace(-1, 1, {n})", f"torch.eye({max(n, 1)})", f"torch.full(({shape},), 0.5)",
        "torch.tensor([1.0, -2.0, 3.0])", f"torch.zeros({shape}, dtype=torch.int64)",
        f"torch.empty({shape}).fill_(1.5)", f"torch.arange({n * 2}).view({n}, 2).float() / 4",
    ])


FAMILIES = [(30, unary), (30, binary), (12, reduction), (16, view), (6, matmul), (8, misc), (3, factory)]


def expr(g, depth: int = 1):
    """(text, value) of a random tensor expression over the live locals, or None."""
    for _ in range(8):
        family = g.choose(FAMILIES)
        x = operand(g, depth)
        if x is None and family is not factory:
            continue
        try:
            text = family(g, x, depth)
        except (ValueError, IndexError):
            continue
        if text is None:
            continue
        try:
            v = g.st.eval(text)
        except Exception:
            continue
        if isinstance(v, torch.Tensor) and v.numel() <= MAX_NUMEL and v.dim() <= MAX_NDIM:
            return text, v
    return None
