"""PYTEST_DONT_REWRITE

Idioms of real library code (transformers, torch.utils) that must trace whole:
ModelOutput dataclass-dicts, configs with their own ``__getattribute__``,
``torch.compiler.is_compiling()``, ``inspect.signature`` of a forward, ``torch.finfo``,
``@torch.no_grad()``-decorated helpers, abstract base classes, ``hasattr`` on modules.
"""
import abc
import dataclasses
import inspect
from typing import Optional

import pytest
import torch

import kiln

from .harness import T, check, shapes


def _model_output_class():
    transformers = pytest.importorskip("transformers")

    @dataclasses.dataclass
    class LMOutput(transformers.utils.ModelOutput):
        loss: Optional[torch.Tensor] = None
        logits: Optional[torch.Tensor] = None
        hidden: Optional[tuple] = None

    return LMOutput


def test_model_output_reads_and_rebuild():
    LMOutput = _model_output_class()

    def f(x):
        out = LMOutput(logits=x * 2)
        first = out[0]  # ints index the tuple of non-None fields
        keys = list(out.keys())
        n = len(out)
        out.hidden = (x + 1,)  # a field set later becomes an item too
        return out, first, keys, n, "loss" in out, out.loss is None, out["logits"] + out.to_tuple()[1][0]
    check(f, shapes((3,)), graphs=1, breaks=0, fullgraph=True)


def test_model_output_positional_and_missing_key():
    LMOutput = _model_output_class()

    def f(x):
        out = LMOutput(x.sum(), x)
        try:
            out["hidden"]
        except KeyError:
            x = x + 1
        return out.to_tuple(), x
    check(f, shapes((4,)), graphs=1, breaks=0, fullgraph=True)


class AliasConfig:
    """Reads of ``layers`` go to ``n_layer`` (transformers' attribute_map)."""
    attribute_map = {"layers": "n_layer"}

    def __init__(self):
        self.n_layer = 3
        self.scale = 0.5

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def test_config_with_getattribute():
    cfg = AliasConfig()

    def f(x):
        for _ in range(cfg.layers):
            x = x * cfg.scale
        return x, getattr(cfg, "missing", 7), hasattr(cfg, "n_layer")
    check(f, shapes((3,)), graphs=1, breaks=0, fullgraph=True)


def test_is_compiling_reads_true_inside_library_helpers():
    def helper():
        return torch.compiler.is_compiling()

    def f(x):
        return x + 1 if helper() else x - 1
    x = torch.randn(3)
    out = kiln.compile(f, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(out, x + 1)
    assert not helper()


def test_inspect_signature_of_a_forward():
    class Block(torch.nn.Module):
        def chunk(self, a):
            return a * 2

        def forward(self, x):
            fn = self.chunk
            n = len(inspect.signature(fn).parameters)
            return fn(x) if n == 1 else x
    m = Block()
    check(m, shapes((3,)), graphs=1, breaks=0, fullgraph=True)


def test_finfo_min_mask():
    def f(x, mask):
        return x.masked_fill(mask, torch.finfo(x.dtype).min), torch.iinfo(torch.int32).max
    check(f, lambda i: (T(2, 3), T(2, 3) > 0), graphs=1, breaks=0, fullgraph=True)


@torch.no_grad()
def _no_grad_helper(x):
    return x * 3


def test_no_grad_decorated_helper():
    def f(x):
        y = _no_grad_helper(x)
        return y.requires_grad, y + x
    check(f, lambda i: (T(3).requires_grad_(),), graphs=1, breaks=0, fullgraph=True)


class Shape(abc.ABC):
    @abc.abstractmethod
    def area(self, x): ...


class Square(Shape):
    def __init__(self, k):
        self.k = k

    def area(self, x):
        return x * self.k


def test_abstract_base_class_instances():
    def f(x):
        return Square(2).area(x)
    check(f, shapes((3,)), graphs=1, breaks=0, fullgraph=True)


def test_hasattr_on_module_missing_attribute():
    lin = torch.nn.Linear(3, 3)

    def f(x):
        g = 2 if hasattr(lin, "num_key_value_groups") and lin.num_key_value_groups > 1 else 1
        return lin(x) * g, hasattr(lin, "weight")
    check(f, shapes((2, 3)), graphs=1, breaks=0, fullgraph=True)


def test_fullgraph_error_names_every_inlined_line():
    def inner(x):
        return x.tolist()  # the line kiln cannot trace

    def f(x):
        return inner(x + 1)
    with pytest.raises(kiln.Unsupported) as e:
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(3))
    msg = str(e.value)
    assert "return inner(x + 1)" in msg and "return x.tolist()" in msg, msg


def test_environ_switch_is_guarded(monkeypatch):
    import os

    def f(x):
        if os.environ.get("KILN_TEST_SWITCH", "0") == "1":
            return x + 1
        return x - 1, "KILN_TEST_SWITCH" in os.environ
    x = torch.randn(3)
    cf = kiln.compile(f, backend="eager", fullgraph=True)
    monkeypatch.delenv("KILN_TEST_SWITCH", raising=False)
    torch.testing.assert_close(cf(x), f(x))
    monkeypatch.setenv("KILN_TEST_SWITCH", "1")  # the guard sees the change: recompiles
    torch.testing.assert_close(cf(x), x + 1)


class _Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x + 1  # deliberately not the true derivative: it must be used


def test_autograd_function_apply_is_one_node():
    def f(x):
        return _Cube.apply(x * 2).sum()
    check(f, lambda i: (T(4).requires_grad_(),), graphs=1, breaks=0, fullgraph=True, backward=True)


def test_autograd_function_backward_under_aot_eager():
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    f = lambda x: _Cube.apply(x.sin()).sum()  # noqa: E731
    f(x).backward()
    ref = x.grad.clone()
    x.grad = None
    kiln.compile(f, backend="aot_eager", fullgraph=True)(x).backward()
    torch.testing.assert_close(x.grad, ref)


def test_config_get_text_config_is_evaluated_and_guarded():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.T5Config(num_layers=2, num_decoder_layers=3, d_model=8, num_heads=2, d_kv=4, d_ff=16)

    def f(x):
        dec = cfg.get_text_config(decoder=True)  # deep-copies and renames keys
        return x * dec.num_hidden_layers
    cf = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), f(x))
    before = f(x)
    cfg.num_layers = 5  # a changed config must not reuse the traced answer
    assert not torch.equal(f(x), before)
    torch.testing.assert_close(cf(x), f(x))


def test_logging_and_warnings_run_after_the_graph(caplog):
    import logging
    import warnings

    log = logging.getLogger("kiln.test.library_idioms")

    def f(x):
        y = x * 2
        if log.isEnabledFor(logging.DEBUG):
            y = y + 1
        log.warning("scaling by %d", 2)
        warnings.warn("deprecated path", UserWarning)
        return y + 1
    cf = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    log.setLevel(logging.WARNING)
    with caplog.at_level(logging.WARNING, logger="kiln.test.library_idioms"), \
            pytest.warns(UserWarning, match="deprecated path"):
        out = cf(x)
    torch.testing.assert_close(out, x * 2 + 1)
    assert "scaling by 2" in caplog.text  # the message was not lost
    log.setLevel(logging.DEBUG)  # the guard on isEnabledFor sees the change
    with pytest.warns(UserWarning):
        torch.testing.assert_close(cf(x), x * 2 + 2)


def test_logging_a_tensor_value_breaks_the_graph():
    import logging

    log = logging.getLogger("kiln.test.library_idioms")

    def f(x):
        log.info("value %s", x.sum())
        return x + 1
    ex = kiln.explain(f)(torch.randn(3))
    assert ex.graph_break_count == 1
