"""Comparing two Observations of the same call: eager's (the reference) and a compiled
run's. Every difference is a ``Mismatch`` naming the call, where it was seen (the
return value, the arguments after the call, the globals, the gradients...), what
differs (the facet) and the path to it."""
from __future__ import annotations

import dataclasses
import math

import torch

from .observe import DictSnap, ObjSnap, Observation, SeqSnap, TensorSnap, ValueSnap

#: (rtol, atol) per dtype; exact for everything not listed. float64 is as loose as
#: float32 because programs mix them: a float64 result of a float32 sum inherits the
#: float32 sum's rounding, which a reordered (fused) sum changes.
TOLERANCE = {
    torch.float32: (1e-4, 1e-4),
    torch.float64: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
    torch.complex64: (1e-4, 1e-4),
    torch.complex128: (1e-7, 1e-7),
}
#: Python floats (``.item()`` of a float32 value, most often)
FLOAT_TOL = (1e-4, 1e-4)
#: Every float of a program that computes in half precision anywhere: kiln (like
#: inductor) computes fp16/bf16 ops in fp32 and rounds once at the store, so values
#: that passed through half precision differ from eager's by half-precision rounding.
HALF_TOL = (5e-2, 5e-2)
#: Gradients: a backward sums more terms, and ill-conditioned ops (layer_norm of a
#: constant row) amplify float32 rounding.
GRAD_TOL = (1e-3, 1e-3)

#: Where a difference was seen, by the root of its path.
WHERE = {"out": "output", "args": "mutation", "bases": "mutation", "grads": "grad", "stale": "stale_output"}


@dataclasses.dataclass(frozen=True)
class Mismatch:
    call: int
    where: str  # output, mutation, global, grad, stale_output, exception, grad_mode, backward
    facet: str  # values, dtype, shape, strides, contiguity, layout, alias, identity, requires_grad, ...
    path: str
    detail: str
    other: str = ""  # the second path of a relation (alias, identity)

    def __str__(self):
        return f"call {self.call + 1}: {self.where}/{self.facet} at {self.path or '-'}: {self.detail}"


def _where(path: str) -> str:
    if ".grad" in path:
        return "grad"
    root = path.split("[", 1)[0].split(".", 1)[0]
    return WHERE.get(root, "global")


class _Cmp:
    def __init__(self, call: int, eager: Observation, loose: bool = False):
        self.call = call
        self.eager = eager
        self.loose = loose
        self.found: list[Mismatch] = []

    def add(self, facet, path, detail, other=""):
        self.found.append(Mismatch(self.call, _where(path), facet, path, detail, other))

    # ------------------------------------------------------------- trees
    def tree(self, a, b, path):
        if type(a) is not type(b) or getattr(a, "kind", None) != getattr(b, "kind", None):
            self.add("type", path, f"eager {_kind(a)}, compiled {_kind(b)}")
            return
        if isinstance(a, TensorSnap):
            self.tensor(a, b, path)
        elif isinstance(a, SeqSnap):
            if len(a.items) != len(b.items):
                self.add("length", path, f"eager {len(a.items)}, compiled {len(b.items)}")
                return
            for i, (x, y) in enumerate(zip(a.items, b.items)):
                self.tree(x, y, f"{path}[{i}]")
        elif isinstance(a, DictSnap):
            if a.keys != b.keys:
                self.add("keys", path, f"eager {a.keys}, compiled {b.keys}")
                return
            for k, x, y in zip(a.keys, a.items, b.items):
                self.tree(x, y, f"{path}[{k}]")
        elif isinstance(a, ObjSnap):
            if list(a.attrs) != list(b.attrs):
                self.add("attributes", path, f"eager {list(a.attrs)}, compiled {list(b.attrs)}")
                return
            for k in a.attrs:
                self.tree(a.attrs[k], b.attrs[k], f"{path}.{k}")
        elif isinstance(a, ValueSnap):
            if not _same_value(a.value, b.value, self.loose):
                self.add("value", path, f"eager {a.value!r}, compiled {b.value!r}")

    def tensor(self, a: TensorSnap, b: TensorSnap, path):
        for facet in ("dtype", "shape", "layout"):
            if getattr(a, facet) != getattr(b, facet):
                self.add(facet, path, f"eager {getattr(a, facet)}, compiled {getattr(b, facet)}")
                return
        if path.startswith("stale"):  # only whether the old values survived the next call
            diff = value_difference(a.values, b.values, self.loose)
            if diff:
                self.add("values", path, diff)
            return
        for facet in ("requires_grad", "is_leaf"):
            if getattr(a, facet) != getattr(b, facet):
                self.add(facet, path, f"eager {getattr(a, facet)}, compiled {getattr(b, facet)}")
        diff = value_difference(a.values, b.values, self.loose, grad=_where(path) == "grad")
        if diff:
            self.add("values", path, diff)
        self.layout(a, b, path)
        if (a.grad is None) != (b.grad is None):
            self.add("grad", path + ".grad", f"eager {_none(a.grad)}, compiled {_none(b.grad)}")
        elif a.grad is not None:
            self.tensor(a.grad, b.grad, path + ".grad")

    def layout(self, a: TensorSnap, b: TensorSnap, path):
        """Strides: exact for arguments (their metadata after the call is the user's
        object) and for outputs that view an input; contiguity alone for fresh outputs
        (what code reading them can observe cheaply: ``.view`` succeeds or not)."""
        if a.layout != torch.strided or math.prod(a.shape) <= 1 or path.startswith("stale"):
            return
        views_input = a.storage is not None and a.storage < self.eager.n_input_storages
        if not path.startswith("out") or views_input:
            if _norm_strides(a) != _norm_strides(b) or a.offset != b.offset:
                self.add("strides", path, f"eager {a.stride}+{a.offset}, compiled {b.stride}+{b.offset}")
        elif a.contiguous != b.contiguous:
            self.add("contiguity", path, f"eager contiguous={a.contiguous} {a.stride}, compiled {b.stride}")


def _norm_strides(t: TensorSnap):
    """Strides with those of size-1 dims left out (they never address anything)."""
    return tuple(s for s, n in zip(t.stride, t.shape) if n != 1)


def _kind(s):
    return getattr(s, "kind", None) or type(s).__name__


def _none(x):
    return "None" if x is None else "a tensor"


def _same_value(a, b, loose=False) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) and math.isnan(b):
            return True
        rtol, atol = HALF_TOL if loose else FLOAT_TOL
        return a == b or abs(a - b) <= atol + rtol * abs(a)
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y, loose) for x, y in zip(a, b))
    return a == b


def tolerance(dtype: torch.dtype, loose: bool = False, grad: bool = False) -> tuple[float, float]:
    rtol, atol = TOLERANCE.get(dtype, (0.0, 0.0))
    if dtype.is_floating_point or dtype.is_complex:
        for flag, (r, a) in ((loose, HALF_TOL), (grad, GRAD_TOL)):
            if flag:
                rtol, atol = max(rtol, r), max(atol, a)
    return rtol, atol


def value_difference(a: torch.Tensor, b: torch.Tensor, loose: bool = False, grad: bool = False) -> str:
    """'' if ``b`` matches ``a`` within ``a``'s dtype's tolerance, else what differs."""
    if a.numel() == 0:
        return ""
    rtol, atol = tolerance(a.dtype, loose, grad)
    if a.dtype.is_floating_point or a.dtype.is_complex:
        close = torch.isclose(b, a, rtol=rtol, atol=atol, equal_nan=True)
    else:
        close = a == b
    if bool(close.all()):
        return ""
    bad = (~close).nonzero()[0].tolist()
    idx = tuple(bad)
    n_bad = int((~close).sum())
    return f"{n_bad}/{a.numel()} elements differ; first at {list(idx)}: eager {a[idx].item()!r}, compiled {b[idx].item()!r}"


def _tensor_paths(snap, path, out, skip_grads=True):
    """(path, TensorSnap | container snap with ident) pairs of a tree, in order."""
    if isinstance(snap, TensorSnap):
        out.append((path, snap))
    elif isinstance(snap, SeqSnap):
        if snap.ident is not None:
            out.append((path, snap))
        for i, x in enumerate(snap.items):
            _tensor_paths(x, f"{path}[{i}]", out)
    elif isinstance(snap, DictSnap):
        out.append((path, snap))
        for k, x in zip(snap.keys, snap.items):
            _tensor_paths(x, f"{path}[{k}]", out)
    elif isinstance(snap, ObjSnap):
        if snap.ident is not None:
            out.append((path, snap))
        for k, x in snap.attrs.items():
            _tensor_paths(x, f"{path}.{k}", out)


def _roots(obs: Observation):
    roots = [("args", obs.args), ("bases", obs.bases), ("out", obs.out)]
    return roots + [(k, v) for k, v in obs.globals.items()]


def _relations(cmp: _Cmp, e: Observation, c: Observation):
    """Which values share storage with which (and which are the same object) must be
    the same: an output that views an input in eager must view it compiled, and a
    fresh output must not alias anything."""
    pe, pc = [], []
    for (name, se), (_, sc) in zip(_roots(e), _roots(c)):
        _tensor_paths(se, name, pe)
        _tensor_paths(sc, name, pc)
    common = dict(pc)
    pairs = [(p, s, common[p]) for p, s in pe if p in common]
    storage_seen = set()
    for i, (p1, a1, b1) in enumerate(pairs):
        for p2, a2, b2 in pairs[i + 1:]:
            if p1.startswith(("args", "bases")) and p2.startswith(("args", "bases")):
                continue  # inputs are made identically; a changed input shows in its values
            if isinstance(a1, TensorSnap) and isinstance(a2, TensorSnap):
                sa = a1.storage is not None and a1.storage == a2.storage
                sb = isinstance(b1, TensorSnap) and isinstance(b2, TensorSnap) and \
                    b1.storage is not None and b1.storage == b2.storage
                if sa != sb and (p1, p2) not in storage_seen:
                    storage_seen.add((p1, p2))
                    cmp.add("alias", p2, f"{'shares' if sa else 'does not share'} storage with {p1} in eager, "
                                         f"{'does' if sb else 'does not'} compiled", p1)
            ia = a1.ident == a2.ident
            ib = b1.ident == b2.ident and type(b1) is type(b2)
            if ia != ib:
                cmp.add("identity", p2, f"{'is' if ia else 'is not'} the same object as {p1} in eager, "
                                        f"{'is' if ib else 'is not'} compiled", p1)


def compare(call: int, e: Observation, c: Observation, loose: bool = False) -> list[Mismatch]:
    """Every difference of the compiled run ``c`` from eager's ``e`` (``loose``: floats
    compared with half precision's tolerance)."""
    cmp = _Cmp(call, e, loose)
    if e.exc != c.exc:
        cmp.found.append(Mismatch(call, "exception", "type", "", f"eager {e.exc}, compiled {c.exc}: {c.exc_msg}"))
    if e.grad_mode != c.grad_mode:
        cmp.found.append(Mismatch(call, "grad_mode", "value", "", f"eager left grad mode {e.grad_mode}, "
                                                                  f"compiled {c.grad_mode}"))
    if e.exc is None and c.exc is None:
        cmp.tree(e.out, c.out, "out")
    cmp.tree(e.args, c.args, "args")
    cmp.tree(e.bases, c.bases, "bases")
    for k in sorted(set(e.globals) | set(c.globals)):
        if k not in e.globals or k not in c.globals:
            cmp.add("missing", k, f"eager has it: {k in e.globals}, compiled: {k in c.globals}")
        else:
            cmp.tree(e.globals[k], c.globals[k], k)
    if e.backward_exc != c.backward_exc and (e.backward_exc is None or c.backward_exc is None
                                             or e.backward_exc.split(":")[0] != c.backward_exc.split(":")[0]):
        cmp.found.append(Mismatch(call, "backward", "exception", "", f"eager {e.backward_exc}, "
                                                                     f"compiled {c.backward_exc}"))
    if e.grads is not None and c.grads is not None and e.backward_exc is None and c.backward_exc is None:
        cmp.tree(e.grads, c.grads, "grads")
    if e.out_after_next is not None and c.out_after_next is not None and e.exc is None and c.exc is None:
        cmp.tree(e.out_after_next, c.out_after_next, "stale")
    if e.exc is None and c.exc is None:
        _relations(cmp, e, c)
    return cmp.found
