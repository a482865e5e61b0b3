"""Training through kiln as in eager: which backward nodes run, what they add, what
they free, and which ops are differentiated at all.

Each case is a program made twice (``make()``: one copy for eager, one compiled, each
with its own state), called on two rounds of equal fresh inputs; after each call a
backward runs from the outputs ``pick`` selects, with fixed random tangents. Compared:
outputs (values, dtype, requires_grad), the exception each call and each backward
raises (its type), and ``.grad`` of every leaf made so far (None or values), which
also shows what a later backward adds to an earlier call's leaves."""
from __future__ import annotations

import math

import pytest
import torch

import kiln

BACKENDS = ["aot_eager", "kiln"]


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


def _run(prog, inputs, pick, leaves, seed):
    """One call and its backward: (outputs, call error, backward error)."""
    try:
        out = prog(*inputs)
    except Exception as e:          # noqa: BLE001  (compared by type)
        return None, type(e), None
    outs = [o for o in pick(_tensors(out)) if o.requires_grad]
    if not outs:
        return out, None, None
    g = torch.Generator().manual_seed(seed)
    tangents = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)
                for o in outs]
    try:
        torch.autograd.backward(outs, tangents)
    except Exception as e:          # noqa: BLE001
        return out, None, type(e)
    return out, None, None


def _same(a, b, what):
    assert type(a) is type(b), what
    if isinstance(a, torch.Tensor):
        assert (a.shape, a.dtype, a.requires_grad) == (b.shape, b.dtype, b.requires_grad), what
        torch.testing.assert_close(b.detach(), a.detach(), rtol=1e-5, atol=1e-5,
                                   equal_nan=True, msg=what)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), what
        for k, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{what}[{k}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), what
    else:
        assert a == b, what


def compare(make, make_inputs, backend, pick=lambda outs: outs, calls=2):
    """``make()`` -> a fresh program; ``make_inputs()`` -> (inputs, leaves)."""
    eager, compiled = make(), kiln.compile(make(), backend=backend)
    e_leaves, c_leaves = [], []
    for call in range(calls):
        torch.manual_seed(call)
        e_in, e_new = make_inputs()
        torch.manual_seed(call)
        c_in, c_new = make_inputs()
        e_leaves += e_new
        c_leaves += c_new
        e_out, e_err, e_bw = _run(eager, e_in, pick, e_leaves, call)
        c_out, c_err, c_bw = _run(compiled, c_in, pick, c_leaves, call)
        assert c_err is e_err, f"call {call}: eager raised {e_err}, compiled {c_err}"
        assert c_bw is e_bw, f"call {call}: eager's backward raised {e_bw}, compiled's {c_bw}"
        _same(e_out, c_out, f"call {call} output")
        for j, (a, b) in enumerate(zip(e_leaves, c_leaves)):
            assert (a.grad is None) == (b.grad is None), f"call {call}: leaf {j} grad None"
            if a.grad is not None:
                _same(a.grad, b.grad, f"call {call}: leaf {j} grad")
    return compiled


def _leaf(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_()


# --- which backward nodes run -------------------------------------------------------

def _held_from_earlier_call():
    """A global keeps an output of the previous call; this call multiplies it into
    another global only. Eager's backward from the result never runs the previous
    call's history (freed by its own backward)."""
    G = {}

    def prog(x):
        out = x.sin()
        if "last" in G:
            G["acc"] = G["last"] * x
        G["last"] = x.exp()
        return out
    return prog


def _dict_entry_lifted_unused():
    """The trace reads a dict the program writes: its old value (from the previous
    call) becomes a graph input that no output uses."""
    G = {}

    def prog(x0, x1):
        v1 = x1 / x0
        G["last"] = v1
        kiln.graph_break()
        return v1, v1 * 2 + 1
    return prog


def _global_written_in_place():
    """A global buffer accumulates an input in place (so it requires grad from then
    on) beside an independent result: the backward from the result never reaches the
    buffer's history, which an earlier backward freed."""
    G = {"t": torch.ones(4)}

    def prog(x1, x2):
        G["t"].mul_(x1)
        return x2 * 2
    return prog


def _memo_of_first_call():
    """A closure caches a reduction of the first call's input; later calls add it. The
    later backward runs the first call's sum again: it saved nothing, so eager allows
    it (and adds into the first call's leaf again)."""
    cache = {}

    def prog(x):
        if "k" not in cache:
            cache["k"] = x.sum()
        return x + cache["k"]
    return prog


def _two_results(a, b):
    return a * 2, b * 3


#: (name, make, arguments): the backward runs from every output
NODE_CASES = [
    ("held_from_earlier_call", _held_from_earlier_call, lambda: [_leaf(3)]),
    ("dict_entry_lifted_unused", _dict_entry_lifted_unused,
     lambda: [_leaf(5), _leaf(2, 1).expand(2, 5)]),
    ("global_written_in_place", _global_written_in_place, lambda: [_leaf(4), _leaf(4)]),
    ("memo_of_first_call", _memo_of_first_call, lambda: [_leaf(3)]),
]


def _with_leaves(make_args):
    def inputs():
        args = make_args()
        leaves = [a if a.is_leaf else a._base for a in args
                  if isinstance(a, torch.Tensor) and a.requires_grad]
        return args, leaves
    return inputs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,make,make_args", NODE_CASES, ids=[c[0] for c in NODE_CASES])
def test_backward_runs_what_eager_runs(name, make, make_args, backend):
    compare(make, _with_leaves(make_args), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hook_of_an_input_the_backward_does_not_reach_is_not_called(backend):
    """Eager never calls a leaf's hook when the backward does not reach the leaf; a
    compiled graph joining both inputs in one node would call it (with None)."""
    calls = []

    def make_inputs():
        a, b = _leaf(3), _leaf(3)
        b.register_hook(lambda g: calls.append(g.clone()))
        return [a, b], [a, b]

    compare(lambda: _two_results, make_inputs, backend, pick=lambda outs: outs[:1])
    assert calls == []


# --- what the backward adds ---------------------------------------------------------

def _scaled_twice(x, y):
    return x * 2, x * y


def _live_across_a_break(x, y):
    a = x * 2
    b = x * y
    kiln.graph_break()
    return a, b > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prog", [_scaled_twice, _live_across_a_break],
                         ids=["output_not_backwarded", "value_live_across_a_break"])
def test_an_output_without_gradient_adds_nothing(prog, backend):
    """An output the backward does not reach adds nothing: not a zero tangent times an
    infinite derivative (NaN)."""
    def make_inputs():
        x = _leaf(3)
        return [x, torch.tensor([1.0, math.inf, 2.0])], [x]
    compare(lambda: prog, make_inputs, backend, pick=lambda outs: outs[:1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_input_written_after_the_call_matters_only_where_the_backward_reads_it(backend):
    """Writing an input in place after the call makes eager's backward fail only where
    it reads that input (``x.sin()``'s); a backward from the other output works."""
    def prog(x, y):
        return y * 2, x.sin()

    results = []
    for fn in (prog, kiln.compile(prog, backend=backend)):
        torch.manual_seed(0)
        xl, y = _leaf(3), _leaf(3)
        x = xl * 1
        a, b = fn(x, y)
        x.mul_(3)
        a.backward(torch.ones(3))
        try:
            b.backward(torch.ones(3))
            second = None
        except RuntimeError as e:
            second = type(e)
        results.append((y.grad, xl.grad, second))
    (ey, ex, esecond), (cy, cx, csecond) = results
    torch.testing.assert_close(cy, ey)
    assert ex is None and cx is None
    assert esecond is csecond is RuntimeError


# --- ops eager does not differentiate -------------------------------------------------

def _floor_divide_live_across_a_break(x, y):
    q = x // y
    kiln.graph_break()
    return x * 2, q > 0


def _floor_divide_returned(x, y):
    q = x // y
    kiln.graph_break()
    return x * 2, q


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prog", [_floor_divide_live_across_a_break, _floor_divide_returned],
                         ids=["live_across_a_break", "returned"])
def test_an_op_without_derivative_raises_only_where_the_backward_reaches_it(prog, backend):
    """``floor_divide`` has no derivative: eager's backward raises when it reaches one,
    and only then (here: only when the quotient itself is backwarded)."""
    def make_inputs():
        x, y = _leaf(4), _leaf(4)
        return [x, y], [x, y]
    compare(lambda: prog, make_inputs, backend)


# --- views, grad mode and in-place writes ----------------------------------------------

def _view_made_after_no_grad_block(x):
    s = x.flatten()[0].item()
    with torch.set_grad_enabled(False):
        kiln.graph_break()
        s = s + x.dim()
    v = x.unflatten(0, (1, -1))       # made with grad on, in a graph entered with it off
    with torch.enable_grad():
        kiln.graph_break()
        out = x * s
    v.add_(2)
    return out, v


def _view_made_in_no_grad(x):
    with torch.no_grad():
        v = x[1:]
    return v, x * 2


def _write_through_detached_alias(x):
    v = x.detach()
    v.zero_()
    return x * 2


def _write_through_detached_view(x):
    x.detach()[0].fill_(3.0)
    return x.sin()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prog,view_of_leaf", [
    (_view_made_after_no_grad_block, False),
    (_write_through_detached_alias, True),
    (_write_through_detached_view, True),
], ids=["view_made_after_no_grad_block", "detached_alias_of_leaf_view",
        "detached_view_of_leaf_view"])
def test_views_and_writes_keep_eager_autograd_standing(prog, view_of_leaf, backend):
    """A view is made in the grad mode eager makes it in (one made with grad off
    refuses an in-place write with grad on, one made with grad on does not); a write
    autograd does not record (through a detached alias, even of a view of a leaf)
    leaves the input's autograd history as it was."""
    def make_inputs():
        leaf = _leaf(5)
        x = leaf[1:] if view_of_leaf else leaf * 1
        return [x], [leaf]
    compare(lambda: prog, make_inputs, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_made_in_no_grad_refuses_a_write_with_grad_on(backend):
    results = []
    for fn in (_view_made_in_no_grad, kiln.compile(_view_made_in_no_grad, backend=backend)):
        x = _leaf(4) * 1
        v, _ = fn(x)
        try:
            v.mul_(2)
            results.append((v.requires_grad, None))
        except RuntimeError as e:
            results.append((v.requires_grad, type(e)))
    assert results[0] == results[1]
    assert results[0][1] is RuntimeError


def _write_after_a_no_grad_block(x):
    with torch.no_grad():
        kiln.graph_break()
    for _ in range(2):
        v = x[None]
        v.mul_(0.5)           # recorded: grad is on again (the graph turned it on)
        kiln.graph_break()
    return v, x


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_recorded_in_a_graph_entered_with_grad_off(backend):
    """A graph entered inside ``no_grad`` that turns grad on and writes an input: the
    write is copied back into the input under autograd, as eager recorded it."""
    def make_inputs():
        leaf = _leaf(4, 1)
        return [leaf.clone()[1:]], [leaf]
    compare(lambda: _write_after_a_no_grad_block, make_inputs, backend)


# --- what the backward keeps ----------------------------------------------------------

def _exp_then_write_input(x):
    y = x.exp()               # eager keeps y: writing x later is fine
    kiln.graph_break()
    x.add_(1)
    return y


def _scaled_sin_then_write_input(x):
    y = (x * 2).sin()         # eager keeps x * 2, not x
    kiln.graph_break()
    x.mul_(3)
    return y


def _sin_then_write_input(x):
    y = x.sin()               # eager keeps x: its backward fails after the write
    kiln.graph_break()
    x.add_(1)
    return y


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_later_write_fails_the_backward_only_where_eager_kept_the_tensor(backend):
    """The compiled backward may recompute from an input eager never kept; a later
    in-place write to that input must not fail it (eager's does not), while one to an
    input eager kept still does."""
    def make_inputs():
        leaf = _leaf(4)
        return [leaf * 1], [leaf]
    for prog in (_exp_then_write_input, _scaled_sin_then_write_input,
                 _sin_then_write_input):
        compare(lambda: prog, make_inputs, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prog,written", [
    (lambda x: x.exp(), lambda out: out),
    (lambda x: (x.sigmoid() * 1, x.tanh()), lambda out: out[1]),
], ids=["exp_result", "tanh_result_beside_another"])
def test_a_later_write_to_an_output_eager_kept_fails_the_backward(prog, written, backend):
    """Eager keeps the results of exp and tanh: writing one in place after the call fails
    its backward, whatever the compiled backward kept (a copy, or a recomputation)."""
    results = []
    for fn in (prog, kiln.compile(prog, backend=backend)):
        x = _leaf(4) * 1
        out = fn(x)
        written(out).add_(1)
        outs = list(out) if isinstance(out, tuple) else [out]
        try:
            sum(o.sum() for o in outs).backward()
            results.append(None)
        except RuntimeError as e:
            results.append(type(e))
    assert results[0] is RuntimeError
    assert results[1] is results[0]


def _squeeze_leaf_in_no_grad(x):
    with torch.no_grad():
        x.squeeze_()          # allowed on a leaf that requires grad: grad is off
    return x * 2


def _transpose_after_a_no_grad_block(x):
    with torch.no_grad():
        kiln.graph_break()
        s = x.sum()
    x.t_()                    # grad on again (the graph turned it on): recorded
    return x * s, x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prog,leaf_input", [(_squeeze_leaf_in_no_grad, True),
                                             (_transpose_after_a_no_grad_block, False)],
                         ids=["squeeze_leaf_in_no_grad", "transpose_after_no_grad_block"])
def test_geometry_change_of_an_input_in_the_graphs_grad_mode(prog, leaf_input, backend):
    """An in-place geometry change of an input happens in the grad mode the graph had
    set, which autograd sees (or not) as eager's did."""
    def make_inputs():
        leaf = _leaf(3, 1)
        return [leaf if leaf_input else leaf * 1], [leaf]
    compare(lambda: prog, make_inputs, backend)


def _squeeze_intermediate_in_no_grad_live_across_a_break(x):
    v = x * 2
    with torch.no_grad():
        v.squeeze_()          # v's grad_fn still expects the unsqueezed shape
    kiln.graph_break()
    return x.sin()


def _squeeze_intermediate_in_no_grad_returned(x):
    v = x * 2
    with torch.no_grad():
        v.squeeze_()
    kiln.graph_break()
    return x.sin(), v


@pytest.mark.parametrize("shape", [(2, 0, 1, 3), (2, 1, 3)], ids=["empty", "nonempty"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prog", [_squeeze_intermediate_in_no_grad_live_across_a_break,
                                  _squeeze_intermediate_in_no_grad_returned],
                         ids=["live_across_a_break", "returned"])
def test_geometry_change_of_an_intermediate_under_no_grad(prog, backend, shape):
    """``squeeze_`` under no_grad on an intermediate that requires grad: its grad_fn
    keeps the old shape, and eager's backward refuses its gradient ("invalid gradient
    at index 0") when, and only when, it reaches it. The graph's trace differentiates
    every output, this one too: it must not fail the compile (fuzz seed 3753)."""
    def make_inputs():
        x = _leaf(*shape)
        return [x], [x]
    compare(lambda: prog, make_inputs, backend)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_expanded_input_transposed_in_place_and_saved(dtype, backend):
    """``x.t_()`` on an expanded input the backward reads: the forward saves a clone of
    it, whose layout is the clone's (dense), not the input's stride 0 (fuzz seed 535:
    fp16 on the CPU clones through the library, whose result was then copied into
    the planned overlapping layout, which raises)."""
    def make():
        def prog(x):
            x.t_()
            return x.max() * 2, x.sum()
        return prog

    def make_inputs():
        leaf = torch.randn(1, 1, dtype=dtype).requires_grad_()
        return [leaf.clone().expand(5, 3)], [leaf]
    compare(make, make_inputs, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_backward_through_a_node_that_saved_only_sizes(backend, monkeypatch):
    """With symbolic sizes the first call's backward keeps only a size (``sum``'s
    backward expands to it); a later call's backward runs that node again, as eager
    allows, its saved tensors freed (fuzz seed 590 under KILN_DYNAMIC_SHAPES=true)."""
    monkeypatch.setattr(kiln.config, "dynamic_shapes", "true")
    compare(_memo_of_first_call, _with_leaves(lambda: [_leaf(1, 4)]), backend, calls=3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_absent_tangent_of_a_sum_is_a_dense_zero(dtype, backend):
    """The loss reaches only ``2 * x0``: the backward for that tangent alone returns a
    structural zero for ``x1`` in place of the sum's ``expand`` of its absent tangent.
    That ``zeros`` kept the expand's layout (stride 0) as its own: the kernels' runtime
    copied the library's dense zeros into that overlapping layout, which raises (fuzz
    seed 2054: the backward raised where eager's ran)."""
    def make():
        def prog(x0, x1):
            return x0 + x0, x1.sum()
        return prog

    def make_inputs():
        leaves = [torch.randn((), dtype=torch.float32).requires_grad_(),
                  torch.randn(5, dtype=dtype).requires_grad_()]
        return list(leaves), leaves
    with kiln.config.patch(suppress_errors=False):
        compare(make, make_inputs, backend, pick=lambda outs: outs[:1])
    kiln.reset()
