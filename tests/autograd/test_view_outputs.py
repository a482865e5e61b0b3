"""Outputs that are views of intermediates, as eager has them: views of their base
(``_is_view``, strides, storage offset), made in the grad mode eager made them in
(``requires_grad``, ``is_leaf``), writable in place where eager's are, with eager's
gradients; outputs whose geometry changed in place (``t_``) own their storage."""
import pytest
import torch

import kiln


def _detached_and_view(x):
    v = (x * 2).view(-1)
    return v.detach(), v


def _view_made_without_grad(x):
    y = x * 2
    with torch.no_grad():
        v = y.view(-1)
    return y, v


def _view_in_a_grad_free_region(x):
    with torch.no_grad():
        y = x + 1
    return y[1:], (x * 3)[:, 0]


def _t_in_place_then_views(x):
    y = x + 1
    y.t_()
    return y[1:], y[0], y


def _slice_of_intermediate(x):
    return (x.exp() + 1)[:, 1:3]


def _select_of_intermediate_and_more(x):
    y = torch.sin(x.t())
    return y[2], y.sum()


PROGRAMS = [_detached_and_view, _view_made_without_grad, _view_in_a_grad_free_region,
            _t_in_place_then_views, _slice_of_intermediate, _select_of_intermediate_and_more]


def _facts(outs):
    return [(o.shape, o.stride(), o.storage_offset(), o.requires_grad, o.is_leaf,
             o._is_view()) for o in outs]


def _run(fn, grad):
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0)).requires_grad_(grad)
    outs = fn(x)
    facts = _facts(outs)
    diff = [o for o in outs if o.requires_grad]
    if diff:
        sum((o * o).sum() for o in diff).backward()
    errors, versions = [], [o._version for o in outs]
    for o in outs:                      # a write with grad mode on, after the backward
        try:
            o.mul_(torch.full((), 2.0, requires_grad=True))
            errors.append(None)
        except RuntimeError as e:
            errors.append(type(e).__name__)
    # version counters shared where eager's are: each write bumps all sharing one
    facts.append([o._version - v for o, v in zip(outs, versions)])
    return facts, x.grad, errors, [o.detach() for o in outs]


@pytest.mark.parametrize("grad", [True, False], ids=["train", "inference"])
@pytest.mark.parametrize("fn", PROGRAMS, ids=[f.__name__ for f in PROGRAMS])
def test_view_outputs_as_eager(fn, grad):
    e_facts, e_grad, e_errors, e_vals = _run(fn, grad)
    c_facts, c_grad, c_errors, c_vals = _run(kiln.compile(fn, backend="kiln"), grad)
    assert c_facts == e_facts
    assert c_errors == e_errors
    assert (c_grad is None) == (e_grad is None)
    if e_grad is not None:
        torch.testing.assert_close(c_grad, e_grad)
    for a, b in zip(c_vals, e_vals):
        torch.testing.assert_close(a, b)
