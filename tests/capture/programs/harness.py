"""PYTEST_DONT_REWRITE

Shared checker for the capture corpus: one ``check`` used by every program.

Why a single checker: every program is held to the same contract -- the compiled
callable must be indistinguishable from eager PyTorch (outputs, exceptions, mutated
inputs, mutated state), and the capture must produce the expected number of graphs and
breaks.  The compiler under test is kiln by default, or torch.compile when
``KILN_CORPUS_ORACLE=torch`` (used to validate the corpus itself; see ``__init__``).
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import math
import os

import numpy as np
import torch

ORACLE = os.environ.get("KILN_CORPUS_ORACLE", "").strip().lower()
TORCH_MODE = ORACLE == "torch"

if TORCH_MODE:
    import torch._dynamo as _dynamo

    graph_break = _dynamo.graph_break
    disable = _dynamo.disable
    Unsupported = _dynamo.exc.Unsupported

    def _reset():
        _dynamo.reset()

    def _compile(fn, backend, fullgraph):
        return torch.compile(fn, backend=backend, fullgraph=fullgraph)

    def _explain(fn):
        return _dynamo.explain(fn)

else:
    import kiln

    graph_break = kiln.graph_break
    disable = kiln.disable
    Unsupported = kiln.Unsupported

    def _reset():
        kiln.reset()

    def _compile(fn, backend, fullgraph):
        return kiln.compile(fn, backend=backend, fullgraph=fullgraph)

    def _explain(fn):
        return kiln.explain(fn)


def dynamo_bug(reason):
    """Mark a program whose eager behaviour torch.compile gets wrong (torch mode only):
    the test stays strict for kiln, and is an expected failure against dynamo."""
    import pytest

    return pytest.mark.xfail(TORCH_MODE, reason=f"dynamo: {reason}", strict=True)


# Marker for counts that should be asserted against kiln only: dynamo's number differs
# because of a dynamo quirk (explained at the use site).
def KILN_ONLY(n):
    return None if TORCH_MODE else n


RTOL = 1e-6
ATOL = 1e-6

_OP_NODES = ("call_function", "call_method", "call_module")


class CountingBackend:
    """Records every graph it is given; runs it as it is (``gm.forward``)."""

    def __init__(self):
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def op_counts(self) -> list[int]:
        return [sum(n.op in _OP_NODES for n in gm.graph.nodes) for gm in self.graphs]


# --------------------------------------------------------------------------- inputs

class Args:
    """Positional and keyword arguments for one call (``make_inputs`` may return one;
    a plain tuple means positional arguments only)."""

    def __init__(self, *args, **kwargs):
        self.args = args
        self.kwargs = kwargs


def _as_args(inputs) -> Args:
    if isinstance(inputs, Args):
        return inputs
    if isinstance(inputs, tuple):
        return Args(*inputs)
    return Args(inputs)


# --------------------------------------------------------------------------- state
# The program refers to its mutable state directly (a global list, a closed-over dict,
# a module); we snapshot it, run eager, record the result, restore the live object in
# place (so identities and guards stay valid), then run compiled and compare.

class Globals:
    """State adapter for module-level names a program rebinds (``global n; n += 1``):
    ``state=Globals(globals(), "n", "cache")``.  Snapshots hold the names' values."""

    def __init__(self, namespace: dict, *names: str):
        self.namespace = namespace
        self.names = names

    def values(self) -> dict:
        return {n: self.namespace[n] for n in self.names}


def _view(state):
    """What of a live state object is compared: the values, for Globals."""
    return state.values() if isinstance(state, Globals) else state


def _nonleaf_tensors(obj, seen, depth=0):
    """Tensors inside ``obj`` that deepcopy refuses (non-leaf, graph-connected ones)."""
    if id(obj) in seen or depth > 8:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if not obj.is_leaf:
            yield obj
        return
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = list(vars(obj).values())
    else:
        return
    for it in items:
        yield from _nonleaf_tensors(it, seen, depth + 1)


def snapshot(obj):
    """deepcopy, except that graph-connected tensors become detached copies (keeping
    their requires_grad flag), since deepcopy cannot copy them."""
    obj = _view(obj)
    memo = {}
    for t in _nonleaf_tensors(obj, set()):
        memo[id(t)] = t.detach().clone().requires_grad_(t.requires_grad)
        memo[id(t)].snapshot_of_nonleaf = True     # compared as the non-leaf it was
    return copy.deepcopy(obj, memo)


def _restore_list(live, snap):
    live[:] = snapshot(snap)


def _restore_dict(live, snap):
    live.clear()
    live.update(snapshot(snap))


def _restore_set(live, snap):
    live.clear()
    live.update(snapshot(snap))


def _restore_tensor(live, snap):
    with torch.no_grad():
        live.copy_(snap)


def _plain_attrs(m: torch.nn.Module) -> dict:
    """A module's own Python attributes (``training``, counters, cached values...),
    without nn.Module's bookkeeping dicts (parameters, buffers, submodules, hooks)."""
    return {k: v for k, v in vars(m).items() if not k.startswith("_")}


def _restore_module(live, snap):
    with torch.no_grad():
        live.load_state_dict(snap.state_dict())
    for m_live, m_snap in zip(live.modules(), snap.modules()):
        vars(m_live).update(snapshot(_plain_attrs(m_snap)))


def _restore_object(live, snap):
    d = snapshot(vars(snap))
    vars(live).clear()
    vars(live).update(d)


def _restore_globals(live, snap):
    live.namespace.update(snapshot(snap))


_RESTORE = [
    (Globals, _restore_globals),
    (torch.nn.Module, _restore_module),
    (torch.Tensor, _restore_tensor),
    (list, _restore_list),
    (dict, _restore_dict),
    (set, _restore_set),
]


def _restore(live, snap):
    for typ, rule in _RESTORE:
        if isinstance(live, typ):
            return rule(live, snap)
    return _restore_object(live, snap)


def _states(state):
    if state is None:
        return ()
    return tuple(state) if isinstance(state, tuple) else (state,)


# --------------------------------------------------------------------------- compare

def _cmp_tensor(a, b, path):
    assert isinstance(b, torch.Tensor), f"{path}: eager gave a tensor, compiled {type(b)}"
    torch.testing.assert_close(b, a, rtol=RTOL, atol=ATOL, equal_nan=True, msg=lambda m: f"{path}: {m}")
    assert a.requires_grad == b.requires_grad, f"{path}: requires_grad {a.requires_grad} vs {b.requires_grad}"
    a_leaf = a.is_leaf and not getattr(a, "snapshot_of_nonleaf", False)
    assert a_leaf == b.is_leaf, f"{path}: is_leaf {a_leaf} vs {b.is_leaf}"
    assert a_leaf == (b.grad_fn is None), f"{path}: grad_fn {a.grad_fn} vs {b.grad_fn}"


def _cmp_seq(a, b, path):
    assert len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        compare(x, y, f"{path}[{i}]")


def _cmp_dict(a, b, path):
    assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} vs {list(b)}"
    for k in a:
        compare(a[k], b[k], f"{path}[{k!r}]")


def _cmp_module(a, b, path):
    compare(dict(a.state_dict(keep_vars=True)), dict(b.state_dict(keep_vars=True)), f"{path}.state_dict()")
    for (name, ma), mb in zip(a.named_modules(), b.modules()):
        compare(_plain_attrs(ma), _plain_attrs(mb), f"{path}.{name or 'self'}")


def _cmp_ndarray(a, b, path):
    assert isinstance(b, np.ndarray), f"{path}: compiled gave {type(b)}"
    assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL, err_msg=path)


def _cmp_float(a, b, path):
    assert a == b or (math.isnan(a) and math.isnan(b)), f"{path}: {a!r} vs {b!r}"


def _cmp_object(a, b, path):
    compare(vars(a), vars(b), f"{path}.__dict__")


def _cmp_dataclass(a, b, path):
    for f in dataclasses.fields(a):
        compare(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")


_COMPARE = [
    (torch.Tensor, _cmp_tensor),
    (torch.nn.Module, _cmp_module),
    (np.ndarray, _cmp_ndarray),
    (float, _cmp_float),
    ((list, tuple, collections.deque), _cmp_seq),
    (dict, _cmp_dict),
]


def compare(a, b, path="out"):
    """Eager value ``a`` against compiled value ``b``; raises AssertionError with a path."""
    if not isinstance(a, torch.Tensor):
        assert type(a) is type(b), f"{path}: type {type(a).__name__} vs {type(b).__name__}"
    for typ, rule in _COMPARE:
        if isinstance(a, typ):
            return rule(a, b, path)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return _cmp_dataclass(a, b, path)
    if type(a).__eq__ is object.__eq__ and hasattr(a, "__dict__") and not callable(a):
        return _cmp_object(a, b, path)
    assert a == b, f"{path}: {a!r} vs {b!r}"


# --------------------------------------------------------------------------- running

def _run(fn, args: Args):
    """(result, None) or (None, exception)."""
    try:
        return fn(*args.args, **args.kwargs), None
    except Exception as e:  # noqa: BLE001 -- the program's own exceptions are compared
        return None, e


def _explain_counts(fn, inputs, states):
    snaps = [snapshot(s) for s in states]
    args = copy.deepcopy(inputs)
    _reset()
    try:
        ex = _explain(fn)(*args.args, **args.kwargs)
    finally:
        for s, snap in zip(states, snaps):
            _restore(s, snap)
        _reset()
    return ex


def _tensor_leaves(tree):
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _backward(out):
    """Backpropagate from every output that requires grad (sum of their sums)."""
    outs = [t for t in _tensor_leaves(out) if t.requires_grad and t.dtype.is_floating_point]
    if outs:
        sum(t.sum() for t in outs).backward()


def _grads(args: Args, states):
    """The .grad of every tensor argument, tensor state and module parameter."""
    leaves = _tensor_leaves((args.args, args.kwargs))
    for s in states:
        leaves += list(s.parameters()) if isinstance(s, torch.nn.Module) else _tensor_leaves(s)
    return [t.grad for t in leaves]


def _clear_grads(states):
    for s in states:
        params = s.parameters() if isinstance(s, torch.nn.Module) else _tensor_leaves(s)
        for p in params:
            p.grad = None


def check(fn, make_inputs, *, graphs=None, breaks=None, calls=3, state=None,
          fullgraph=False, ops=None, backward=False, backend=None):
    """Run ``fn`` eagerly and compiled on ``calls`` fresh input sets and compare.

    ``make_inputs(i)`` builds the inputs of call ``i`` (a tuple of positional args, one
    value, or an ``Args``); use ``i`` to flip data-dependent branches or shapes.
    ``state``: the live mutable object(s) the program touches (list, dict, set, tensor,
    module, plain object, or a tuple of them); compared after every call.
    ``graphs``: graphs compiled by the first call; ``breaks``: ``explain``'s
    graph_break_count on the first input set; ``ops``: list of op counts per graph
    compiled by the first call.  ``backward``: also backpropagate from the outputs
    that require grad and compare the gradients of arguments and state.  ``backend``:
    compile with this backend ("eager", "aot_eager", "kiln") instead of the counting
    one (``graphs``/``ops`` are then not counted).  The grad mode after each call is
    compared too.  Returns the counting backend.
    """
    states = _states(state)
    torch.manual_seed(0)
    first = _as_args(make_inputs(0))

    if breaks is not None:
        ex = _explain_counts(fn, first, states)
        assert ex.graph_break_count == breaks, (
            f"graph_break_count {ex.graph_break_count}, expected {breaks}; reasons: {ex.break_reasons}"
        )

    _reset()
    counting = CountingBackend()
    assert backend is None or (graphs is None and ops is None), "graphs/ops are counted on the counting backend"
    cfn = _compile(fn, counting if backend is None else backend, fullgraph)
    try:
        for i in range(calls):
            inputs = first if i == 0 else _as_args(make_inputs(i))
            snaps = [snapshot(s) for s in states]

            grad_mode = torch.is_grad_enabled()
            e_args = copy.deepcopy(inputs)
            e_out, e_exc = _run(fn, e_args)
            e_grad_mode = torch.is_grad_enabled()
            torch.set_grad_enabled(grad_mode)
            if backward and e_exc is None:
                _backward(e_out)
                e_grads = snapshot(_grads(e_args, states))
                _clear_grads(states)
            e_states = [snapshot(s) for s in states]
            for s, snap in zip(states, snaps):
                _restore(s, snap)

            c_args = copy.deepcopy(inputs)
            c_out, c_exc = _run(cfn, c_args)
            c_grad_mode = torch.is_grad_enabled()
            torch.set_grad_enabled(grad_mode)
            if fullgraph and isinstance(c_exc, Unsupported):
                raise c_exc

            where = f"call {i}"
            assert c_grad_mode == e_grad_mode, \
                f"{where}: grad mode after the call {c_grad_mode}, eager leaves {e_grad_mode}"
            if e_exc is not None:
                assert c_exc is not None, f"{where}: eager raised {e_exc!r}, compiled returned {c_out!r}"
                assert type(c_exc) is type(e_exc), f"{where}: eager raised {e_exc!r}, compiled {c_exc!r}"
            else:
                if c_exc is not None:
                    raise AssertionError(f"{where}: compiled raised, eager returned") from c_exc
                compare(e_out, c_out, f"{where}: out")
                if backward:
                    _backward(c_out)
                    compare(e_grads, _grads(c_args, states), f"{where}: grads")
                    _clear_grads(states)
            compare(e_args.args, c_args.args, f"{where}: args")
            compare(e_args.kwargs, c_args.kwargs, f"{where}: kwargs")
            for k, (es, cs) in enumerate(zip(e_states, states)):
                compare(es, _view(cs), f"{where}: state[{k}]")

            if i == 0:
                first_graphs = counting.graph_count
                first_ops = counting.op_counts
        if graphs is not None:
            assert first_graphs == graphs, f"first call compiled {first_graphs} graphs, expected {graphs}"
        if ops is not None:
            assert first_ops == ops, f"ops per graph {first_ops}, expected {ops}"
    finally:
        _reset()
    return counting


def expect_unsupported(fn, make_inputs):
    """With fullgraph=True a program that needs a graph break raises Unsupported."""
    _reset()
    try:
        cfn = _compile(fn, CountingBackend(), True)
        args = _as_args(make_inputs(0))
        try:
            cfn(*args.args, **args.kwargs)
        except Unsupported:
            return
        raise AssertionError("fullgraph=True compile of a breaking program did not raise Unsupported")
    finally:
        _reset()


# --------------------------------------------------------------------------- helpers

def T(*shape, dtype=torch.float32):
    """A fresh random tensor (randn for floats, small ints for integer dtypes)."""
    if dtype.is_floating_point:
        return torch.randn(*shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(*shape) > 0.5
    return torch.randint(-5, 6, shape, dtype=dtype)


def shapes(*shps):
    """make_inputs for tensors of the given shapes."""
    return lambda i: tuple(T(*s) for s in shps)


def flip(i, x):
    """Negate a tensor on odd calls: flips data-dependent branches between calls."""
    return -x if i % 2 else x
