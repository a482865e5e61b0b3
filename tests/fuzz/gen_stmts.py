"""Simple statements of a generated program, one rule per kind of statement.

Each rule reads the live state through ``g`` and returns a ``Block`` (or None when
nothing fits); ``Gen.add`` decides by running it.
"""
from __future__ import annotations

import torch

from .gen_exprs import LITERALS, _bcast, _index, _pick, expr, operand
from .gen_state import atom, block, value_signature



def assign(g):
    """``vN = <expr>``; sometimes rebinding an existing local to a value of the same
    type, shape and dtype (so branches and loops keep later statements valid)."""
    r = expr(g, depth=1)
    if r is None:
        return None
    text, v = r
    if g.rng.random() < 0.2:
        same = g.locals_of(torch.Tensor, lambda u: value_signature(u) == value_signature(v))
        name = g.pick(same)
        if name is not None:
            return block(f"{name} = {text}", features=["rebind"])
    name = g.fresh("v")
    return block(f"{name} = {text}", defines=[name])


def _target(g):
    """The tensor an in-place statement writes: an argument, a view, or any local."""
    if g.rng.random() < 0.35:
        params = [p for p in g.plan.params if isinstance(g.st.ns.get(p), torch.Tensor)]
        if params:
            return g.rng.choice(params)
    return g.tensor()


def _into(g, v) -> str:
    """A value that broadcasts into ``v``'s shape: a literal or a local."""
    if g.rng.random() < 0.4:
        return _pick(g, LITERALS)
    y = operand(g, 0, lambda u: _bcast(u.shape, v.shape) and torch.broadcast_shapes(u.shape, v.shape) == v.shape)
    return y[0] if y else _pick(g, LITERALS)


def inplace(g):
    t = _target(g)
    if t is None:
        return None
    v = g.value(t)
    rng = g.rng
    y = atom(_into(g, v))
    s = _pick(g, LITERALS)
    d = g.dim(v)
    nd = v.dim()
    opts = [
        f"{t}.add_({y})", f"{t}.mul_({y})", f"{t}.sub_({y})", f"{t}.div_({y})", f"{t}.clamp_(min=-1, max=1)",
        f"{t}.zero_()", f"{t}.fill_({s})", f"{t}.copy_({y})", f"{t}.relu_()", f"{t}.neg_()", f"{t}.abs_()",
        f"{t}.exp_()", f"{t}.sigmoid_()", f"{t}.masked_fill_({t} > 0, 0)", f"{t}[{_index(g, v)}] = {s}",
        f"{t}[{_index(g, v)}] = {y}", f"{t}[{t} > 0] = 0", f"{t} += {y}", f"{t} *= {s}", f"{t} -= {y}",
        f"torch.add({t}, {y}, out={t})", f"torch.mul({t}, {s}, out={t})", f"torch.sin({t}, out={t})",
        f"{t}.clamp_min_(0)", f"{t}.floor_()", f"{t}.addcmul_({y}, {y}, value=0.1)", f"{t}.lerp_({y}, 0.5)",
        f"{t}.pow_(2)", f"{t}.index_fill_({d}, torch.tensor([0]), -1)",
        f"{t}.index_put_((torch.tensor([0]),), torch.tensor({s}))", f"{t}.unsqueeze_({rng.randrange(-nd - 1, nd + 1)})",
        f"{t}.squeeze_()", f"{t}.t_()", f"{t}.squeeze_({d})",
    ]
    if nd >= 2:
        a, b = rng.sample(range(nd), 2)
        opts.append(f"{t}.transpose_({a}, {b})")
    if nd >= 1:
        w = g.fresh("v")
        opts.append(f"{w} = {t}[{_index(g, v)}]\n{w}.mul_({s})")
        opts.append(f"{w} = {t}.view(-1) if {t}.is_contiguous() else {t}.reshape(-1)\n{w}[0] = {s}")
        if rng.random() < 0.2:
            text = rng.choice(opts[-2:])
            return block(text, defines=[w], features=["inplace", "inplace_view"])
    out = g.fresh("v")
    src = operand(g, 0)
    if src is not None and rng.random() < 0.15:
        fn = rng.choice([f"torch.add({src[0]}, {y}, out={out})", f"torch.sum({src[0]}, {g.dim(src[1])}, out={out})",
                         f"torch.mul({src[0]}, 2, out={out})", f"torch.exp({src[0]}, out={out})"])
        return block(f"{out} = torch.empty(0, dtype={src[1].dtype})\n{fn}", defines=[out], features=["out="])
    return block(rng.choice(opts), features=["inplace"])


def scalar(g):
    """A Python value read from tensors or computed from other Python values."""
    t = g.tensor()
    if t is None:
        return None
    v = g.value(t)
    n = g.fresh("s")
    d = g.dim(v) if v.dim() else 0
    s = g.pick(g.locals_of((int, float)))
    opts = [
        f"{n} = {t}.sum().item()", f"{n} = {t}.max().item()", f"{n} = float({t}.float().mean())",
        f"{n} = int({t}.argmax())", f"{n} = {t}.shape[{d}]", f"{n} = {t}.size({d})", f"{n} = {t}.numel()",
        f"{n} = {t}.dim()", f"{n} = {t}.tolist()", f"{n} = bool(({t} > 0).any())",
        f"{n} = {t}.flatten()[0].item()", f"{n} = {t}.sum().tolist()", f"{n} = {t}.stride()",
        f"{n} = {t}.shape", f"{n} = {t}.is_contiguous()", f"{n} = {t}.dtype",
    ]
    if s is not None:
        opts += [f"{n} = {s} * 2 + 1", f"{n} = max({s}, 1)", f"{n} = math.sqrt(abs({s}))", f"{n} = {s} + {t}.dim()"]
    return block(g.rng.choice(opts), defines=[n], features=["item"] if "item" in opts[0] else ["scalar"])


def container(g):
    rng = g.rng
    t1, t2 = g.tensor(), g.tensor()
    if t1 is None:
        return None
    n = g.fresh("c")
    lists = g.locals_of(list, lambda l: all(isinstance(u, torch.Tensor) for u in l))
    dicts = g.locals_of(dict)
    tuples = g.locals_of(tuple, lambda t: len(t) == 2)
    opts = [
        (f"{n} = [{t1}, {t2}]", [n]), (f"{n} = {{'a': {t1}, 'b': {t2}.shape[0] if {t2}.dim() else 0}}", [n]),
        (f"{n} = ({t1}, {t2})", [n]),
    ]
    for l in lists[-2:]:
        v = g.fresh("v")
        opts += [(f"{l}.append({t1})", []), (f"{l}.insert(0, {t1})", []), (f"{v} = {l}.pop()", [v]),
                 (f"{l}[0] = {t1}", []), (f"{v} = {l}[-1]", [v]), (f"{l}.extend([{t1}, {t2}])", []),
                 (f"{l}.reverse()", []), (f"{n} = [{atom('u')} * 2 for u in {l}]", [n]),
                 (f"{v} = torch.stack({l})", [v]), (f"{v} = torch.cat({l})", [v]), (f"{v} = sum({l})", [v]),
                 (f"{v} = len({l})", [v])]
    for dn in dicts[-2:]:
        keys = list(g.value(dn))
        v = g.fresh("v")
        opts += [(f"{dn}['k{rng.randrange(3)}'] = {t1}", []), (f"{dn}.update(extra={t1})", [])]
        if keys:
            k = repr(rng.choice(keys))
            opts += [(f"{v} = {dn}[{k}]", [v]), (f"del {dn}[{k}]", []), (f"{v} = {dn}.pop({k})", [v]),
                     (f"{n} = {{k: u for k, u in {dn}.items() if isinstance(u, torch.Tensor)}}", [n])]
    for tn in tuples[-1:]:
        a, b = g.fresh("v"), g.fresh("v")
        opts.append((f"{a}, {b} = {tn}", [a, b]))
    text, defs = rng.choice(opts)
    return block(text, defines=defs, features=["container"])


_GLOBAL_KINDS = ("counter", "list", "dict", "tensor", "flag", "weight")


def _new_global(g, kind, t):
    """(name, header text) of a new module global of ``kind``."""
    i = g.fresh("")
    if kind == "counter":
        return f"G_n{i}", f"G_n{i} = {g.rng.choice([0, 1, 5])}\n"
    if kind == "list":
        return f"G_l{i}", f"G_l{i} = []\n"
    if kind == "dict":
        return f"G_d{i}", f'G_d{i} = {{"scale": {g.rng.choice(["2.0", "0.5", "3"])}, "calls": 0}}\n'
    if kind == "flag":
        return f"G_f{i}", f"G_f{i} = {g.rng.choice(['True', 'False'])}\n"
    v = g.value(t)
    shape = ", ".join(str(s) for s in v.shape)
    if kind == "weight":
        return f"G_w{i}", f"G_w{i} = torch.linspace(-1, 1, {v.numel()}).reshape({shape or '()'}).requires_grad_()\n"
    return f"G_t{i}", f"G_t{i} = torch.linspace(-1, 1, {v.numel()}).reshape({shape or '()'})\n"


def global_state(g):
    """Module globals read, mutated and rebound (``global`` statements)."""
    rng = g.rng
    t = g.tensor()
    if t is None:
        return None
    existing = [k for k in g.st.ns if k.startswith("G_") and k[2] in "nldtfw"]
    header = ()
    if existing and rng.random() < 0.5:
        name = rng.choice(existing)
    else:
        name, text = _new_global(g, rng.choice(_GLOBAL_KINDS), t)
        header = (text,)
    n = g.fresh("v")
    kind = name[2]
    opts = {
        "n": [(f"{name} += 1", [], [name]), (f"{name} = {name} + {t}.dim()", [], [name]),
              (f"{n} = {t} * {name}", [n], [])],
        "l": [(f"{name}.append({t})", [], []), (f"{n} = len({name})", [n], []),
              (f"{name}.append({t}.sum().item())", [], [])],
        "d": [(f'{name}["calls"] += 1', [], []), (f'{n} = {t} * {name}["scale"]', [n], []),
              (f'{name}["last"] = {t}', [], [])],
        "t": [(f"{n} = {t} + {name}", [n], []), (f"{name}.mul_(0.5)", [], []), (f"{name}.add_({t})", [], []),
              (f"{name} = {t}.detach() * 2", [], [name]), (f"{n} = {name}.sum() + {t}", [n], [])],
        "f": [(f"{name} = not {name}", [], [name]), (f"{n} = {t} * 2 if {name} else {t} - 1", [n], [])],
        "w": [(f"{n} = {t} * {name}", [n], []), (f"{n} = ({name} * {t}).sum()", [n], [])],
    }[kind]
    text, defs, writes = rng.choice(opts)
    return block(text, defines=defs, global_writes=writes, header=header, features=["global"])


_CLASSES = {
    "Box": (
        "class K_Box{i}:\n    def __init__(self, t, n):\n        self.t = t\n        self.n = n\n\n"
        "    def scaled(self, k):\n        return self.t * k + self.n\n",
        ["{o} = K_Box{i}({t}, 2)", "{o}.n += 1", "{o}.t = {t}", "{v} = {o}.scaled(1.5)", "{v} = {o}.t * {o}.n"]),
    "Acc": (
        "class K_Acc{i}:\n    scale = 2.0\n\n    def __init__(self):\n        self.items = []\n"
        "        self.total = None\n\n    def add(self, t):\n        self.items.append(t)\n"
        "        self.total = t if self.total is None else self.total + t\n        return self.total\n\n"
        "    @property\n    def count(self):\n        return len(self.items)\n",
        ["{o} = K_Acc{i}()", "{v} = {o}.add({t})", "{v} = {o}.count", "{v} = {t} * K_Acc{i}.scale"]),
    "Fn": (
        "class K_Fn{i}:\n    def __init__(self, k):\n        self.k = k\n\n    def __call__(self, t):\n"
        "        self.k = self.k + 1\n        return t * self.k\n",
        ["{o} = K_Fn{i}(1)", "{v} = {o}({t})", "{v} = G_o{i}({t})"]),
}


def objects(g):
    """Small user classes: instances made, attributes read and written, methods and
    properties called, a global instance mutated."""
    rng = g.rng
    t = g.tensor()
    if t is None:
        return None
    kind = rng.choice(list(_CLASSES))
    cls_text, stmts = _CLASSES[kind]
    i = g.fresh("")
    o = g.fresh("o")
    header = [cls_text.format(i=i)]
    if kind == "Fn":
        header.append(f"G_o{i} = K_Fn{i}(0)\n")
    # construct, then one to three uses
    lines, defs = [], [o]
    for ln in [stmts[0]] + rng.sample(stmts[1:], rng.randint(1, min(3, len(stmts) - 1))):
        v = g.fresh("v")
        if ln.startswith("{v}"):
            defs.append(v)
        lines.append(ln.format(o=o, v=v, t=t, i=i))
    return block("\n".join(lines), defines=defs, header=header, features=["object"])


_FACTORIES = [
    "def make_affine{i}(a, b):\n    def f(t):\n        return t * a + b\n    return f\n\n"
    "G_c{i} = make_affine{i}({a}, {b})\n",
    "def make_counter{i}():\n    n = 0\n\n    def step(t):\n        nonlocal n\n        n += 1\n"
    "        return t * n\n    return step\n\nG_c{i} = make_counter{i}()\n",
    "def make_memo{i}():\n    cache = {{}}\n\n    def f(t):\n        if 'k' not in cache:\n"
    "            cache['k'] = t.sum()\n        return t + cache['k']\n    return f\n\nG_c{i} = make_memo{i}()\n",
]


def closure(g):
    """Closures: module-level factories (with state in their cells) and functions
    defined inside ``prog`` over its locals."""
    rng = g.rng
    t = g.tensor()
    if t is None:
        return None
    v, fn = g.fresh("v"), g.fresh("fn")
    r = rng.random()
    if r < 0.45:
        i = g.fresh("")
        text = rng.choice(_FACTORIES).format(i=i, a=rng.choice(["2.0", "-1"]), b=rng.choice(["0.5", "3"]))
        return block(f"{v} = G_c{i}({t})", defines=[v], header=[text], features=["closure"])
    s = g.pick(g.locals_of((int, float))) or "2"
    u = g.tensor()
    lists = g.locals_of(list)
    opts = [f"def {fn}(t):\n    return t * {s} + 1\n{v} = {fn}({t})",
            f"def {fn}(t):\n    return t + {u}\n{v} = {fn}({t})",
            f"{fn} = lambda t: torch.relu(t) * 2\n{v} = {fn}({t})"]
    if lists:
        opts.append(f"def {fn}(t):\n    {lists[-1]}.append(t)\n    return len({lists[-1]})\n{v} = {fn}({t})")
    return block(rng.choice(opts), defines=[fn, v], features=["closure"])


def grad_stmt(g):
    """detach, requires_grad_, grad-mode switches left as they are, grad-state reads."""
    t = g.tensor()
    if t is None:
        return None
    n = g.fresh("v")
    opts = [
        (f"{n} = {t}.detach()", [n]), (f"{n} = {t}.detach().float().requires_grad_()", [n]),
        (f"{n} = torch.ones(3, requires_grad=True)", [n]), ("torch.set_grad_enabled(False)", []),
        ("torch.set_grad_enabled(True)", []), (f"{n} = torch.is_grad_enabled()", [n]),
        (f"{n} = {t}.requires_grad", [n]), (f"{n} = {t}.detach() if {t}.requires_grad else {t} * 1", [n]),
    ]
    text, defs = g.rng.choice(opts)
    return block(text, defines=defs, features=["grad"])


def graph_break_stmt(g):
    return block("graph_break()", features=["graph_break"])
