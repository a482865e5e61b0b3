"""Weak references made inside compiled functions (kiln/capture/weak_refs.py): made,
stored on new and existing objects, called while their referent is provably alive, and
rebuilt after the graph as real ``weakref.ref``s; a call whose referent may be dead is
a graph break with eager's answer. Every result is compared with eager's."""
import weakref

import pytest
import torch

import kiln


class Box:
    def __init__(self, t):
        self.t = t


class Slotted:
    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


class Forward:
    """torch 2.11's ``Transform.inv``: the inverse is cached through a weak reference."""

    def __init__(self):
        self._inv = None

    @property
    def inv(self):
        inv = None
        if self._inv is not None:
            inv = self._inv()
        if inv is None:
            inv = Inverse(self)
            self._inv = weakref.ref(inv)
        return inv

    def __call__(self, x):
        return x.exp()


class Inverse:
    def __init__(self, fwd):
        self.fwd = fwd

    def __call__(self, y):
        return y.log()


def _explain(fn, *args):
    return kiln.explain(fn)(*args)


def _one_graph(fn, *args):
    ex = _explain(fn, *args)
    assert ex.graph_break_count == 0, ex
    assert ex.graph_count == 1, ex


def ref_to_new_object(x):
    b = Box(x + 1)
    r = weakref.ref(b)
    got = r()
    return got.t * 2, got is b, r() is None, isinstance(r, weakref.ref)


def ref_stored_on_new_object(x):
    holder, b = Box(x), Box(x.sin())
    holder.r = weakref.ref(b)
    return holder.r().t + holder.t, holder.r() is not None


def same_ref_twice(x):
    b = Box(x)
    return weakref.ref(b) is weakref.ref(b), x + 1


def inverse_cached_by_weak_ref(x):
    f = Forward()
    inv = f.inv
    again = f.inv              # alive (``inv`` holds it): the cached one
    return inv(f(x)), again is inv


@pytest.mark.parametrize("fn", [ref_to_new_object, ref_stored_on_new_object, same_ref_twice,
                                inverse_cached_by_weak_ref])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_made_and_called_in_one_graph(fn, backend):
    x = torch.randn(3) .abs() + 0.5
    _one_graph(fn, x)
    cf = kiln.compile(fn, backend=backend, fullgraph=True)
    for _ in range(2):
        got, want = cf(x), fn(x)
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor):
                torch.testing.assert_close(g, w)
            else:
                assert g == w


def test_ref_on_existing_object_replayed():
    """``holder.r = weakref.ref(obj)``: after the call the holder has a real weak
    reference to the real object (the returned one, or an existing one)."""
    def fn(holder, other, x):
        b = Box(x * 2)
        holder.r = weakref.ref(b)
        other.r = weakref.ref(holder)
        return b

    holder, other, x = Box(None), Box(None), torch.randn(3)
    _one_graph(fn, Box(None), Box(None), x)
    cf = kiln.compile(fn, fullgraph=True)
    b = cf(holder, other, x)
    assert type(holder.r) is weakref.ref and holder.r() is b
    torch.testing.assert_close(b.t, x * 2)
    assert type(other.r) is weakref.ref and other.r() is holder
    assert other.r is weakref.ref(holder)         # CPython's one plain reference
    del b
    assert holder.r() is None                     # as in eager: nothing else holds it


def test_returned_ref_rebuilt():
    def fn(x):
        b = Box(x + 1)
        return weakref.ref(b), b

    cf = kiln.compile(fn, fullgraph=True)
    r, b = cf(torch.ones(2))
    assert type(r) is weakref.ref and r() is b
    r2, _ = fn(torch.ones(2))
    torch.testing.assert_close(r().t, r2().t)


def test_dead_referent_is_a_break_with_eagers_answer():
    """Nothing the trace tracks holds the referent: eager says None (reference count 0);
    kiln does not guess: it breaks there and runs the call eagerly."""
    def fn(x):
        r = weakref.ref(Box(x))
        return x + 1, r() is None

    ex = _explain(fn, torch.ones(2))
    assert [b.break_id for b in ex.break_reasons] == ["K0058"], ex
    got = kiln.compile(fn)(torch.ones(2))
    assert got[1] is fn(torch.ones(2))[1] is True
    torch.testing.assert_close(got[0], torch.ones(2) + 1)


def test_unsupported_forms_break_with_eagers_result():
    def with_callback(x):
        b = Box(x)
        r = weakref.ref(b, lambda _: None)
        return r() is b, x * 2

    def slotted(x):
        weakref.ref(Slotted(x))
        return x

    ex = _explain(with_callback, torch.ones(2))
    assert ex.graph_break_count >= 1
    assert kiln.compile(with_callback)(torch.ones(2))[0] is True
    with pytest.raises(TypeError, match="weak reference"):
        slotted(torch.ones(2))
    with pytest.raises(TypeError, match="weak reference"):
        kiln.compile(slotted)(torch.ones(2))


def test_identity_against_a_real_ref_is_not_guessed():
    """``weakref.ref(o) is o_ref`` is True in CPython when ``o_ref`` is o's plain
    reference: kiln does not answer False."""
    def fn(holder, x):
        return weakref.ref(holder) is holder.r, x + 1

    holder = Box(None)
    holder.r = weakref.ref(holder)
    assert fn(holder, torch.ones(1))[0] is True
    assert kiln.compile(fn)(holder, torch.ones(1))[0] is True
