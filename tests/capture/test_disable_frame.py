"""kiln.disable(fn, recursive=False): fn's frame runs eagerly, the functions it calls
by global name are compiled as their own frames (only when called from compiled code)."""
import operator

import torch

import kiln

COUNTER = 0


def helper(x):
    return torch.sin(x) + 1


@kiln.disable(recursive=False)
def middle(x):
    global COUNTER
    COUNTER += 1
    return helper(x) * 2


@kiln.disable
def middle_recursive(x):
    return helper(x) * 2


def outer(x):
    return middle(x + 1) - 1


def outer_recursive(x):
    return middle_recursive(x + 1) - 1


def _recording():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    return backend, graphs


def test_callees_compiled():
    global COUNTER
    backend, graphs = _recording()
    x = torch.randn(3)
    COUNTER = 0
    out = kiln.compile(outer, backend=backend)(x)
    assert COUNTER == 1                       # the global write reached the module
    torch.testing.assert_close(out, outer(x))
    assert any(torch.sin in g for g in graphs), graphs   # helper: a graph of its own
    assert not any(operator.mul in g for g in graphs), graphs   # middle's own op: eager


def test_recursive_disable_compiles_nothing_inside():
    backend, graphs = _recording()
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(outer_recursive, backend=backend)(x), outer_recursive(x))
    assert not any(torch.sin in g for g in graphs), graphs


def test_outside_compiled_code_nothing_compiles(monkeypatch):
    from kiln.capture import eval_frame
    made = []
    monkeypatch.setattr(eval_frame.CompiledFunction, "_compile_callee",
                        lambda self, fn: made.append(fn) or fn)
    x = torch.randn(3)
    torch.testing.assert_close(middle(x), (torch.sin(x) + 1) * 2)
    assert made == []
