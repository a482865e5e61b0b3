"""Running one call of a program and recording everything it can be compared on.

An ``Observation`` holds snapshots (values copied, metadata kept) of the return value,
the arguments and their bases after the call (mutations), the program's ``G_*``
globals (with the state in closures' cells and objects' attributes), the grad mode the
call left behind, the exception it raised, and in train mode the gradients of the
autograd leaves after a backward from every differentiable output. Storage and object
identities are numbered canonically in one walk (arguments first), so two runs can be
compared on which values alias which.
"""
from __future__ import annotations

import dataclasses
import os
import traceback
import types
import warnings

import torch

from .program import Program

_SCALARS = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device, torch.layout,
            torch.memory_format)


@dataclasses.dataclass
class TensorSnap:
    dtype: torch.dtype
    shape: tuple
    stride: tuple
    offset: int
    contiguous: bool
    layout: torch.layout
    requires_grad: bool
    is_leaf: bool
    values: torch.Tensor
    storage: int | None  # canonical storage number; None for storage-less (empty) tensors
    ident: int  # canonical object number
    grad: object = None  # snapshot of .grad of a leaf that requires grad


@dataclasses.dataclass
class SeqSnap:
    kind: str
    items: list
    ident: int | None = None  # lists (mutable) only


@dataclasses.dataclass
class DictSnap:
    kind: str
    keys: list
    items: list
    ident: int | None = None


@dataclasses.dataclass
class ObjSnap:
    kind: str
    attrs: dict
    ident: int | None = None


@dataclasses.dataclass
class ValueSnap:
    kind: str
    value: object


class Snapshotter:
    """Copies values out, numbering storages and objects in the order first met."""

    def __init__(self):
        self.storages: dict[int, int] = {}
        self.idents: dict[int, int] = {}
        self.keep: list = []  # objects numbered by id must stay alive while numbering
        self.n_input_storages = 0

    def _storage(self, t: torch.Tensor):
        if t.layout != torch.strided:
            return None
        st = t.untyped_storage()
        if st.nbytes() == 0:
            return None
        return self.storages.setdefault(st.data_ptr(), len(self.storages))

    def _ident(self, obj) -> int:
        self.keep.append(obj)
        return self.idents.setdefault(id(obj), len(self.idents))

    def register_inputs(self, *roots):
        """Number the inputs' storages and identities first."""
        for root in roots:
            self.snap(root)
        self.n_input_storages = len(self.storages)

    def snap(self, obj, _stack=()):
        if id(obj) in _stack or len(_stack) > 10:
            return ValueSnap("cycle", None)
        stack = _stack + (id(obj),)
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, stack)
        if isinstance(obj, _SCALARS):
            return ValueSnap(type(obj).__name__, obj)
        if isinstance(obj, torch.Size):
            return ValueSnap("Size", tuple(obj))
        if isinstance(obj, tuple):
            return SeqSnap(type(obj).__name__, [self.snap(x, stack) for x in obj])
        if isinstance(obj, list):
            return SeqSnap("list", [self.snap(x, stack) for x in obj], self._ident(obj))
        if isinstance(obj, dict):
            return DictSnap(type(obj).__name__, [repr(k) for k in obj], [self.snap(v, stack) for v in obj.values()],
                            self._ident(obj))
        if isinstance(obj, (set, frozenset)):
            return ValueSnap(type(obj).__name__, sorted(repr(x) for x in obj))
        if isinstance(obj, types.FunctionType):
            cells = obj.__closure__ or ()
            return ObjSnap("function", {f"cell{i}": self.snap(_cell(c), stack) for i, c in enumerate(cells)})
        if isinstance(obj, (types.ModuleType, type, types.BuiltinFunctionType)):
            return ValueSnap(type(obj).__name__, getattr(obj, "__name__", "?"))
        if hasattr(obj, "__dict__"):
            return ObjSnap(type(obj).__name__, {k: self.snap(v, stack) for k, v in sorted(vars(obj).items())},
                           self._ident(obj))
        return ValueSnap(type(obj).__name__, repr(obj))

    def _tensor(self, t: torch.Tensor, stack) -> TensorSnap:
        d = t.detach()
        if d.layout != torch.strided:
            values = d.to_dense().clone()
        else:
            values = d.clone().resolve_conj().resolve_neg()
        grad = None
        if t.is_leaf and t.requires_grad and t.grad is not None:
            grad = self._tensor(t.grad, stack)
        return TensorSnap(
            dtype=t.dtype, shape=tuple(t.shape), stride=tuple(t.stride()) if t.layout == torch.strided else (),
            offset=t.storage_offset() if t.layout == torch.strided else 0,
            contiguous=t.is_contiguous() if t.layout == torch.strided else False,
            layout=t.layout, requires_grad=t.requires_grad, is_leaf=t.is_leaf, values=values,
            storage=self._storage(t), ident=self._ident(t), grad=grad)


def _cell(c):
    try:
        return c.cell_contents
    except ValueError:
        return None


@dataclasses.dataclass
class Observation:
    exc: str | None = None
    exc_msg: str = ""
    exc_where: str = ""  # the innermost frames of the traceback (grouping crashes)
    out: object = None
    args: object = None
    bases: object = None
    globals: dict = dataclasses.field(default_factory=dict)
    grad_mode: bool = True
    backward_exc: str | None = None
    grads: object = None
    n_input_storages: int = 0
    #: this call's return value read again after the next call (stale buffers)
    out_after_next: object = None


def differentiable_outputs(out) -> list[torch.Tensor]:
    """Tensors in the return value (through lists, tuples, dicts) a backward starts from."""
    found, seen = [], set()

    def walk(o, depth=0):
        if depth > 6:
            return
        if isinstance(o, torch.Tensor):
            if o.requires_grad and (o.is_floating_point() or o.is_complex()) and id(o) not in seen:
                seen.add(id(o))
                found.append(o)
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x, depth + 1)
        elif isinstance(o, dict):
            for x in o.values():
                walk(x, depth + 1)

    walk(out)
    return found


def backward(out, call: int) -> None:
    """Backward from every differentiable output with seeded random gradients."""
    outs = differentiable_outputs(out)
    if not outs:
        return
    g = torch.Generator().manual_seed(1000 + call)
    grads = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype) for o in outs]
    torch.autograd.backward(outs, grads)


def exc_name(e: BaseException) -> str:
    return type(e).__qualname__


def where(e: BaseException, frames: int = 3) -> str:
    """The innermost frames of ``e``'s traceback, one line each."""
    tb = traceback.extract_tb(e.__traceback__)[-frames:]
    return "\n".join(f"{os.path.relpath(f.filename) if f.filename.startswith('/') else f.filename}:{f.lineno} "
                     f"in {f.name}" for f in tb)


def observe_call(program: Program, ns: dict, fn, call: int, train: bool):
    """Run ``fn`` (eager ``prog`` or a compiled one) on call ``call``'s fresh inputs;
    returns (Observation, the live return value)."""
    obs = Observation()
    args, bases, leaves = program.inputs(ns, call, train)
    snapper = Snapshotter()
    snapper.register_inputs(args, bases)
    obs.n_input_storages = snapper.n_input_storages
    torch.set_grad_enabled(True)
    out = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = fn(*args)
        except Exception as e:  # the program's own exceptions are part of its behaviour
            obs.exc, obs.exc_msg, obs.exc_where = exc_name(e), str(e)[:500], where(e)
        obs.grad_mode = torch.is_grad_enabled()
        torch.set_grad_enabled(True)
        obs.out = snapper.snap(out)
        if train and obs.exc is None:
            try:
                backward(out, call)
            except Exception as e:
                obs.backward_exc = f"{exc_name(e)}: {str(e)[:300]}"
        obs.args = snapper.snap(args)
        obs.bases = snapper.snap(bases)
        obs.globals = {k: snapper.snap(ns[k]) for k in sorted(ns) if k.startswith("G_")}
        if train:
            obs.grads = snapper.snap([leaf.grad for leaf in leaves])
    return obs, out


def snap_values(out):
    """A snapshot of a live return value on its own (for re-reading it later)."""
    return Snapshotter().snap(out)
