"""Random arguments for a generated program, as the source of its ``make_inputs``.

Arguments are tensors of varied shapes (0-d, size-1, empty and odd sizes), dtypes and
layouts — contiguous, transposed/permuted, sliced with steps or offsets, expanded
(stride 0), and aliases (a second view of another argument's base, or the very same
tensor twice) — plus the odd Python scalar and container of tensors. Most tensor
arguments share one "family" shape (or a broadcastable variant of it) so that the
program's binary ops find partners.
"""
from __future__ import annotations

import dataclasses
import random

SIZES = [1, 2, 3, 4, 5, 7]
SIZE_WEIGHTS = [3, 4, 4, 2, 3, 2]
NDIM_WEIGHTS = {0: 1.0, 1: 3.0, 2: 4.0, 3: 2.0, 4: 0.4}
DTYPES = {"float32": 60, "float64": 10, "int64": 12, "bool": 8, "float16": 5, "bfloat16": 5}
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
LAYOUTS = {"contiguous": 45, "transposed": 15, "sliced": 15, "expanded": 10, "alias": 15}
SPECIAL_VALUES = ('float("nan")', 'float("inf")', 'float("-inf")', "-0.0", "0.0")


@dataclasses.dataclass
class InputPlan:
    params: list[str]
    text: str


def _weighted(rng: random.Random, table: dict):
    keys = list(table)
    return rng.choices(keys, weights=[table[k] for k in keys])[0]


def random_shape(rng: random.Random, ndim: int | None = None) -> tuple[int, ...]:
    if ndim is None:
        ndim = _weighted(rng, NDIM_WEIGHTS)
    shape = [rng.choices(SIZES, SIZE_WEIGHTS)[0] for _ in range(ndim)]
    if shape and rng.random() < 0.05:
        shape[rng.randrange(ndim)] = 0
    return tuple(shape)


def _family_variant(rng: random.Random, family: tuple[int, ...]) -> tuple[int, ...]:
    """``family`` itself, a suffix of it, or it with some dims set to 1 (all of which
    broadcast against it)."""
    r = rng.random()
    if r < 0.6 or not family:
        return family
    if r < 0.8:
        return family[rng.randrange(len(family) + 1):]
    return tuple(1 if rng.random() < 0.5 else s for s in family)


def _shape_text(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _factory(dtype: str, shape) -> str:
    st = _shape_text(shape)
    if dtype == "int64":
        return f"torch.randint(-4, 5, {st}, generator=g)"
    if dtype == "bool":
        return f"torch.rand({st}, generator=g) < 0.5"
    return f"torch.randn({st}, generator=g, dtype=torch.{dtype})"


def _index_text(name: str, ndim: int, dim: int, item: str) -> str:
    return f"{name}[{', '.join([':'] * dim + [item])}]"


class _Builder:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.base_lines: list[str] = []
        self.bases: list[tuple[str, str, tuple]] = []  # (name, dtype, shape)
        self.arg_lines: list[str] = []
        self.args: list[str] = []  # expressions returned as the argument list
        self.plain_args: dict[str, str] = {}  # base name -> arg name passing it as is

    def base(self, dtype: str, shape) -> str:
        name = f"b{len(self.bases)}"
        self.base_lines.append(f"{name} = {_factory(dtype, shape)}")
        numel = 1
        for s in shape:
            numel *= s
        if dtype in FLOAT_DTYPES and numel and self.rng.random() < 0.06:
            v = self.rng.choice(SPECIAL_VALUES)
            self.base_lines.append(f"{name}.view(-1)[{self.rng.randrange(numel)}] = {v}")
        self.bases.append((name, dtype, tuple(shape)))
        return name

    def tensor_view(self, dtype: str, shape: tuple) -> str:
        """An expression of ``shape`` over a new base (or an alias of an old one)."""
        rng = self.rng
        layout = _weighted(rng, LAYOUTS)
        nd = len(shape)
        if layout == "alias" and self.bases:
            return self.alias()
        if layout == "transposed" and nd >= 2:
            perm = list(range(nd))
            while perm == sorted(perm):
                rng.shuffle(perm)
            base_shape = [0] * nd
            for k, p in enumerate(perm):
                base_shape[p] = shape[k]
            b = self.base(dtype, base_shape)
            if nd == 2:
                return rng.choice([f"{b}.t()", f"{b}.transpose(0, 1)", f"{b}.mT"])
            return f"{b}.permute{tuple(perm)}"
        if layout == "sliced" and nd >= 1:
            d = rng.randrange(nd)
            base_shape = list(shape)
            kind = rng.choice(["step", "offset", "step_offset"])
            if kind == "step":
                base_shape[d] = shape[d] * 2
                item = "::2"
            elif kind == "offset":
                base_shape[d] = shape[d] + 1
                item = "1:"
            else:
                base_shape[d] = shape[d] * 3 + 1
                item = "1::3"
            return _index_text(self.base(dtype, base_shape), nd, d, item)
        if layout == "expanded" and any(s > 1 for s in shape):
            lead = rng.randrange(nd) if nd > 1 and rng.random() < 0.3 else 0
            base_shape = [1 if s > 1 and rng.random() < 0.6 else s for s in shape[lead:]]
            if list(base_shape) == list(shape[lead:]) and not lead:
                base_shape = [1 if s > 1 else s for s in shape]
            b = self.base(dtype, base_shape)
            return f"{b}.expand{_shape_text(shape)}"
        b = self.base(dtype, shape)
        return b

    def alias(self) -> str:
        rng = self.rng
        name, _, shape = rng.choice(self.bases)
        options = [name]
        if shape and shape[0] > 0:
            options += [f"{name}[0]", f"{name}[1:]", f"{name}[::2]"]
        if len(shape) == 2:
            options += [f"{name}.t()"]
        if len(shape) >= 1:
            options += [f"{name}.view(-1)", f"{name}.unsqueeze(0)"]
        return rng.choice(options)


def plan_inputs(rng: random.Random) -> InputPlan:
    """The parameters of ``prog`` and the source of ``make_inputs`` that makes them."""
    b = _Builder(rng)
    family = random_shape(rng)
    params: list[str] = []
    n_tensors = rng.choices([1, 2, 3, 4], [3, 5, 3, 1])[0]
    for i in range(n_tensors):
        dtype = _weighted(rng, DTYPES) if i else rng.choices(
            ["float32", "float64", "int64", "bool", "float16", "bfloat16"], [80, 8, 6, 2, 2, 2])[0]
        shape = _family_variant(rng, family) if rng.random() < 0.7 else random_shape(rng)
        params.append(f"x{i}")
        b.arg_lines.append(f"x{i} = {b.tensor_view(dtype, shape)}")
        b.args.append(f"x{i}")
    if rng.random() < 0.3:
        kind = rng.choice(["int", "float", "bool"])
        name, value = {
            "int": ("n", rng.choice(["1", "2", "3"])),
            "float": ("alpha", rng.choice(["0.5", "-1.5", "2.0"])),
            "bool": ("flag", rng.choice(["True", "False"])),
        }[kind]
        params.append(name)
        b.args.append(value)
    if rng.random() < 0.15:
        kind = rng.choice(["list", "tuple", "dict"])
        items = []
        for _ in range(rng.choice([1, 2, 3])):
            dtype = rng.choice(["float32", "float32", "float64", "int64"])
            items.append(b.tensor_view(dtype, _family_variant(rng, family)))
        if kind == "list":
            expr = "[" + ", ".join(items) + "]"
        elif kind == "tuple":
            expr = "(" + ", ".join(items) + ",)"
        else:
            expr = "{" + ", ".join(f'"k{j}": {it}' for j, it in enumerate(items)) + "}"
        pname = {"list": "xs", "tuple": "tup", "dict": "dct"}[kind]
        params.append(pname)
        b.args.append(expr)
    rng.shuffle(order := list(range(len(params))))
    params = [params[i] for i in order]
    args = [b.args[i] for i in order]
    return InputPlan(params, _make_inputs_text(b, args))


def _make_inputs_text(b: _Builder, args: list[str]) -> str:
    floats = [n for n, dt, _ in b.bases if dt in FLOAT_DTYPES]
    lines = ["def make_inputs(g, train=False, clone=False):"]
    lines += [f"    {ln}" for ln in b.base_lines]
    lines.append(f"    leaves = [{', '.join(floats)}] if train else []")
    lines.append("    for t in leaves:")
    lines.append("        t.requires_grad_()")
    if floats:
        lines.append("    if clone:")
        lines += [f"        {n} = {n}.clone()" for n in floats]
    lines += [f"    {ln}" for ln in b.arg_lines]
    bases = ", ".join(n for n, _, _ in b.bases)
    lines.append(f"    return [{', '.join(args)}], [{bases}], leaves")
    return "\n".join(lines) + "\n"
