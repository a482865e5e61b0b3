"""PYTEST_DONT_REWRITE

Idioms of vision model libraries (torchvision, timm) that the model zoo of issue 6
(tests/models/zoo.py) met: each program is the idiom cut down to a few lines, captured
as one graph.
"""
import types

import torch

from .harness import check, shapes


# torchvision.ops.stochastic_depth: ``if not torch.jit.is_scripting() and not
# torch.jit.is_tracing(): _log_api_usage_once(stochastic_depth)``.  torch.jit.is_tracing
# is Python code calling the C function torch._C._is_tracing: folded to False.
def _log_api_usage_once(obj):
    module = obj.__module__
    if not module.startswith("torchvision"):
        module = f"torchvision.internal.{module}"
    name = obj.__class__.__name__
    if isinstance(obj, types.FunctionType):
        name = obj.__name__
    torch._C._log_api_usage_once(f"{module}.{name}")


def _stochastic_depth(x, p, training):
    if not torch.jit.is_scripting() and not torch.jit.is_tracing():
        _log_api_usage_once(_stochastic_depth)
    if not training or p == 0.0:
        return x
    return x * 2


def test_jit_is_tracing_folds_to_false():
    def f(x):
        return _stochastic_depth(x.sin(), 0.0, True) + 1

    check(f, shapes((2, 3)), graphs=1, breaks=0, fullgraph=True)


def test_c_is_tracing_folds_to_false():
    def f(x):
        if torch._C._is_tracing():
            return x
        return x.cos()

    check(f, shapes((2, 3)), graphs=1, breaks=0, fullgraph=True)


class _Counter:
    def __call__(self, x):
        return x + 1


def test_class_of_functions_and_builtins():
    lam = lambda y: y  # noqa: E731

    def f(x):
        names = (_log_api_usage_once.__class__.__name__, len.__class__.__name__,
                 lam.__class__.__name__, _Counter.__class__.__name__)
        inner = lambda y: y  # noqa: E731
        if inner.__class__ is types.FunctionType and names[0] == "function":
            return x * len(names)
        return x

    check(f, shapes((2,)), graphs=1, breaks=0, fullgraph=True)
