"""Inputs that share storage (``f(x, x[1:])``, the same tensor passed twice) while the
graph writes one of them in place: results must be eager's.

The graphs are traced with every input in its own storage. When no input is written,
aliasing between inputs cannot change a result and those graphs run. When an input the
graph writes shares storage with another input, the call takes a path traced for that
aliasing (the other input is a view of a base input inside the graph:
``AotFunction._aliased``), or, where the tracer cannot model it (no contiguous base,
an aliased input requiring grad…), runs the torch-level graph eagerly
(``AotFunction.eager_calls`` counts those calls).
"""
from __future__ import annotations

import pytest
import torch
import torch.fx as fx

import kiln
from kiln.autograd import aot_compile
from kiln.autograd.backend import aot_eager
from tests.autograd.helpers import assert_close


def _write_then_read(x, y):
    x.mul_(2)
    return (y + 1, x * 3)


def _run_both(f, make_args, fn=None):
    """Compile ``f`` (unless ``fn`` is given), call it and eager on fresh equal
    arguments from ``make_args()``; compare outputs and every argument afterwards."""
    if fn is None:
        fn = aot_eager(fx.symbolic_trace(f), list(make_args()))
    a, b = make_args(), make_args()
    out, ref = fn(*a), f(*b)
    for x, y in zip(out, ref):
        assert_close(x, y)
    for x, y in zip(a, b):
        assert_close(x, y)
    return fn


def test_view_of_a_mutated_input_passed_too():
    def independent():
        return torch.arange(6.), torch.arange(5.)

    def aliased():
        x = torch.arange(6.)
        return x, x[1:]
    fn = _run_both(_write_then_read, independent)     # traced without aliasing
    assert fn.eager_calls == 0
    _run_both(_write_then_read, aliased, fn)           # same function, aliased call
    assert fn.eager_calls == 0 and len(fn._aliased) == 1
    _run_both(_write_then_read, independent, fn)       # and back to the graphs
    _run_both(_write_then_read, aliased, fn)           # the aliased path is reused
    assert fn.eager_calls == 0 and len(fn._aliased) == 1


def test_aliased_from_the_first_call():
    def aliased():
        x = torch.arange(12.).view(3, 4)
        return x.t(), x[1]
    _run_both(_write_then_read, aliased)


def test_same_tensor_passed_twice():
    def f(x, y):
        y.add_(1)
        return (x * 2, y)

    def twice():
        x = torch.arange(4.)
        return x, x
    fn = _run_both(f, twice)
    assert fn.eager_calls == 0 and fn._aliased
    a = twice()
    out = fn(*a)
    assert out[1] is a[1] and torch.equal(a[0], torch.arange(4.) + 1)


def test_aliasing_without_mutation_stays_compiled():
    def f(x, y):
        return (x.sum(0) + y, x * 2)

    def aliased():
        x = torch.arange(12.).view(3, 4)
        return x, x[0]
    fn = _run_both(f, aliased)
    assert fn.eager_calls == 0


def test_training_with_a_buffer_and_its_view():
    # A running statistic updated in place, with a view of it passed as well; the
    # parameter's gradient and the buffer must both be eager's.
    def f(w, buf, view):
        buf.mul_(0.9).add_(w.detach().sum())
        return ((w * view.sum()).sin().sum(),)
    w = torch.randn(3, requires_grad=True)

    def args():
        buf = torch.arange(4.)
        return w.detach().clone().requires_grad_(), buf, buf[2:]
    gm = fx.symbolic_trace(f)
    fn = aot_eager(gm, list(args()))
    a, b = args(), args()
    out, ref = fn(*a), f(*b)
    assert_close(out[0], ref[0])
    out[0].backward()
    ref[0].backward()
    assert_close(a[0].grad, b[0].grad)
    assert_close(a[1], b[1])
    assert fn.eager_calls == 0 and fn._aliased


def test_core_op_set_too():
    def aliased():
        x = torch.arange(6.)
        return x, x[1:]
    fn = aot_compile(fx.symbolic_trace(_write_then_read), list(aliased()),
                     decompositions="core")
    _run_both(_write_then_read, aliased, fn)


def test_through_capture():
    def f(x, y):
        x.mul_(2)
        return y + 1

    opt = kiln.compile(f, backend="aot_eager")
    for make in (lambda: (lambda x: (x, x[1:]))(torch.arange(6.)),
                 lambda: (lambda x: (x, x))(torch.arange(6.)),
                 lambda: (torch.arange(6.), torch.arange(6.))):
        a, b = make(), make()
        assert_close(opt(*a), f(*b))
        assert_close(a[0], b[0])


def test_write_through_the_view_seen_by_the_base():
    def f(x, y):
        y.add_(10)                 # y is a strided view of x
        return (x * 1, y.sum())

    def aliased():
        x = torch.arange(12.).view(3, 4)
        return x, x[:, 1::2]
    fn = _run_both(f, aliased)
    assert fn.eager_calls == 0


def test_returned_alias_of_the_member_is_a_view_of_the_base():
    def f(x, y):
        x.mul_(2)
        return (y,)
    x = torch.arange(6.)
    fn = aot_eager(fx.symbolic_trace(f), [x, x[2:]])
    x = torch.arange(6.)
    out, = fn(x, x[2:])
    assert torch.equal(out, torch.arange(6.)[2:] * 2)
    assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    out.fill_(0)                                   # a real view: writes reach x
    assert torch.equal(x[:2], torch.tensor([0., 2.]))


def test_unmodelled_aliasing_runs_eagerly():
    # no contiguous base at offset 0: x.t() and x[1] of a transposed storage
    def make():
        x = torch.arange(12.).view(4, 3).t()
        return x[1:], x[0]
    fn = _run_both(_write_then_read, make)
    assert fn.eager_calls == 1

    # an aliased input requiring grad
    def f(w, y):
        w.mul_(2)
        return (w * y,)

    def make_grad():
        base = torch.arange(4.).requires_grad_()
        w = base * 1
        return w, w[0]
    gm = fx.symbolic_trace(f)
    a = make_grad()
    fn = aot_eager(gm, list(a))
    out, = fn(*a)
    b = make_grad()
    ref, = f(*b)
    assert_close(out, ref)
    assert fn.eager_calls == 1


# --- in-place geometry changes of an input another input views (fuzz seed 1354) ----
# ``unsqueeze_`` bumps the version counter every view of the tensor shares. Eager bumps
# it at the op; the runtime replays the change after the forward, so a view of the
# changed input saved for the backward (``max`` saves ``v``) was refused by autograd
# ("modified by an inplace operation") where eager's backward runs. Such calls take a
# path traced with the partners' versions bumped too (``AotFunction._partnered``).

def _change_then_save(e, v):
    e.unsqueeze_(-1)
    e.transpose_(0, -1)
    return (torch.max(v) * v.sin().sum(), e + 1)


def _save_then_change(e, v):
    m = torch.max(v)
    e.unsqueeze_(-1)
    return (m,)


def _views_of_one(expand):
    b = torch.tensor([1., 2.], requires_grad=True)
    x = b * 1
    if expand:
        x = x.expand(3, 2)
    return b, (x, x[None])


def _training_outcome(f, fn, expand):
    b, args = _views_of_one(expand)
    outs = fn(*args)
    facts = [(a.shape, a.stride(), a._version) for a in args]
    sum(o.sum() for o in outs).backward()
    return outs, facts, b.grad


def test_geometry_change_of_a_viewed_input_in_training():
    for expand in (False, True):
        gm = fx.symbolic_trace(_change_then_save)
        fn = aot_eager(gm, list(_views_of_one(expand)[1]))
        for _ in range(2):                  # the partnered path, then its reuse
            out, facts, grad = _training_outcome(_change_then_save, fn, expand)
            ref, ref_facts, ref_grad = _training_outcome(_change_then_save,
                                                         _change_then_save, expand)
            for x, y in zip(out, ref):
                assert_close(x, y)
            assert facts == ref_facts
            assert_close(grad, ref_grad)
        assert fn.eager_calls == 0 and len(fn._partnered) == 1


def test_view_saved_before_the_geometry_change_fails_as_in_eager():
    gm = fx.symbolic_trace(_save_then_change)
    fn = aot_eager(gm, list(_views_of_one(False)[1]))
    for f in (_save_then_change, fn):
        _, args = _views_of_one(False)
        out = f(*args)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out[0].backward()
    assert fn.eager_calls == 1      # the traced backward fails too: eager runs it


def test_user_write_after_the_call_fails_the_backward_as_in_eager():
    gm = fx.symbolic_trace(_change_then_save)
    fn = aot_eager(gm, list(_views_of_one(False)[1]))
    for f in (_change_then_save, fn):
        b, args = _views_of_one(False)
        out = f(*args)
        with torch.no_grad():
            args[0].add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out[0].backward()


# --- a written input of no elements that another input views (fuzz seed 2011) -------
# Writing a tensor of no elements changes no value but still bumps the version counter
# it shares with every view of its storage. Eager bumps it at the op, before ``mul``
# saves ``v``; the runtime copies the new value in after the forward had saved ``v`` at
# the version before, so the backward was refused ("modified by an inplace operation",
# of a CopySlices output where the storage requires grad). Storage sharing was judged
# by addresses, leaving out tensors of no elements; a training call now counts them
# (grouped by their storage): the call takes the aliased path, or runs eagerly where the
# tracer cannot model it (a view of no elements, an aliased input requiring grad).

def _write_then_save(x, v, w):
    x.relu_()
    return (torch.mul(v, w),)


def _empty_views(kind, rg):
    torch.manual_seed(0)
    base = torch.randn(4 if kind == "slice" else 0, dtype=torch.float64,
                       requires_grad=rg)
    v = base * 1 if rg else base
    x = {"empty": v.unsqueeze(0), "same": v.view(-1), "slice": v[:0]}[kind]
    w = torch.randn(v.shape, dtype=torch.float64, requires_grad=True)
    return (base, w), (x, v, w)


@pytest.mark.parametrize("kind", ["empty", "same", "slice"])
@pytest.mark.parametrize("rg", [False, True])
def test_write_of_no_elements_to_a_viewed_input_in_training(kind, rg):
    _, args = _empty_views(kind, rg)
    fn = aot_eager(fx.symbolic_trace(_write_then_save), list(args))
    results = []
    for f in (_write_then_save, fn):
        leaves, args = _empty_views(kind, rg)
        out, = f(*args)
        versions = [a._version for a in args]
        out.backward(torch.ones_like(out))
        results.append((out, versions, [t.grad for t in leaves]))
    (out, versions, grads), (ref, ref_versions, ref_grads) = results[1], results[0]
    assert_close(out, ref)
    assert versions == ref_versions
    for g, r in zip(grads, ref_grads):
        assert (g is None) == (r is None)
        if r is not None:
            assert_close(g, r)
    if kind == "same" and not rg:       # the same tensor twice: the aliased path models it
        assert fn.eager_calls == 0 and len(fn._aliased) == 1
    else:
        assert fn.eager_calls == 1


def test_unshared_input_of_no_elements_written_in_training_is_compiled():
    def f(x, w):
        x.relu_()
        return (x * w,)
    w = torch.randn(0, requires_grad=True)
    fn = aot_eager(fx.symbolic_trace(f), [torch.randn(0), w])
    out, = fn(torch.randn(0), w)
    out.sum().backward()
    assert w.grad.shape == (0,) and fn.eager_calls == 0
