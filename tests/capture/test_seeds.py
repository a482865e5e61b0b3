"""The examples of the documents kiln was specified from (shared/seeds: the
TorchDynamo/TorchInductor tutorial and the torch.compile FAQ), each checked against
eager PyTorch on fresh inputs, with the graphs and breaks the seeds describe."""
import numpy as np
import pytest
import scipy.fft
import torch

import kiln


class Counter:
    """A custom backend (the tutorial's contract): records each graph, runs it as is."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def foo(x, y):
    a = torch.sin(x)
    b = torch.cos(x)
    return a + b


def test_foo_with_optimize_and_decorator():
    opt_foo1 = kiln.optimize("eager")(foo)
    x, y = torch.randn(10, 10), torch.randn(10, 10)
    torch.testing.assert_close(opt_foo1(x, y), foo(x, y), rtol=0, atol=0)

    @kiln.compile(backend="eager")
    def opt_foo2(x, y):
        a = torch.sin(x)
        b = torch.cos(x)
        return a + b

    torch.testing.assert_close(opt_foo2(x, y), foo(x, y), rtol=0, atol=0)


def test_module_example():
    class MyModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(100, 10)

        def forward(self, x):
            return torch.nn.functional.relu(self.lin(x))

    mod = MyModule()
    cnt = Counter()
    opt_mod = kiln.optimize(cnt)(mod)
    for _ in range(3):
        x = torch.randn(10, 100)
        torch.testing.assert_close(opt_mod(x), mod(x), rtol=0, atol=0)
    assert len(cnt.graphs) == 1
    # the wrapper shares parameters with the original module
    assert opt_mod.lin.weight is mod.lin.weight


def bar(a, b):
    x = a / (torch.abs(a) + 1)
    if b.sum() < 0:
        b = b * -1
    return x * b


def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    print("woo")
    if b.sum() < 0:
        b = b * -1
    return x * b


def test_bar_gives_three_graphs_over_both_branches():
    cnt = Counter()
    opt_bar = kiln.optimize(cnt)(bar)
    inp1, inp2 = torch.randn(10), torch.randn(10)
    inp2 = inp2.abs()  # b.sum() >= 0
    torch.testing.assert_close(opt_bar(inp1, inp2), bar(inp1, inp2), rtol=0, atol=0)
    torch.testing.assert_close(opt_bar(inp1, -inp2), bar(inp1, -inp2), rtol=0, atol=0)
    assert len(cnt.graphs) == 3
    # graph 1: x = a / (abs(a) + 1), then the data-dependent test
    ops = [n.target for n in cnt.graphs[0].graph.nodes if n.op == "call_function"]
    assert torch.abs in ops


def test_toy_example_explain(capsys):
    ex = kiln.explain(toy_example)(torch.randn(10), torch.randn(10))
    assert ex.graph_count == 3
    assert ex.graph_break_count == 2
    r1, r2 = ex.break_reasons
    assert "print" in r1.reason
    assert "data-dependent" in r2.reason
    assert r1.user_stack[-1].endswith('print("woo")')
    assert "test_seeds.py" in r1.user_stack[-1]
    assert r2.user_stack[-1].endswith("if b.sum() < 0:")
    text = str(ex)
    assert "Graph Count: 3" in text and "Graph Break Count: 2" in text
    assert ex.out_guards and ex.ops_per_graph


def test_toy_example_results_and_print_order(capsys):
    opt = kiln.compile(toy_example, backend="eager")
    for i in range(4):
        a, b = torch.randn(10), torch.randn(10)
        b = b.abs() if i % 2 else -b.abs()
        torch.testing.assert_close(opt(a, b), toy_example(a, b), rtol=0, atol=0)
    assert capsys.readouterr().out == "woo\n" * 8


def f1(x, y):
    if x.sum() < 0:
        return -y
    return y


def test_f1_correct_on_both_branches():
    opt = kiln.compile(f1, backend="eager")
    inp1, inp2 = torch.randn(5, 5), torch.randn(5, 5)
    for x in (inp1.abs(), -inp1.abs()):
        torch.testing.assert_close(opt(x, inp2), f1(x, inp2), rtol=0, atol=0)


def f2(x, y):
    return x + y


def test_f2_int_argument():
    opt = kiln.compile(f2, backend="eager")
    inp1 = torch.randn(5, 5)
    torch.testing.assert_close(opt(inp1, 3), f2(inp1, 3))
    # a different int recompiles rather than reusing a wrong constant
    torch.testing.assert_close(opt(inp1, 4), f2(inp1, 4))


def f3(x):
    x = x * 2
    x = scipy.fft.dct(x.numpy())
    x = torch.from_numpy(x)
    x = x * 2
    return x


def test_f3_scipy_dct():
    cnt = Counter()
    opt = kiln.compile(f3, backend=cnt)
    for _ in range(2):
        inp = torch.randn(5, 5)
        torch.testing.assert_close(opt(inp), f3(inp))
    assert len(cnt.graphs) >= 1


def test_custom_backend_sees_fx_graph(capsys):
    def custom_backend(gm: torch.fx.GraphModule, example_inputs):
        print("custom backend called with FX graph:")
        gm.graph.print_tabular() if False else print(gm.code)
        assert all(isinstance(t, torch.Tensor) for t in example_inputs)
        return gm.forward

    opt = kiln.compile(bar, backend=custom_backend)
    opt(torch.randn(10), torch.randn(10))
    out = capsys.readouterr().out
    assert out.count("custom backend called with FX graph:") == 2
    assert "abs" in out


def test_fullgraph_and_nopython_raise_at_the_break_with_users_line():
    for opt in (kiln.compile(bar, backend="eager", fullgraph=True),
                kiln.optimize("eager", nopython=True)(bar)):
        with pytest.raises(kiln.Unsupported) as e:
            opt(torch.randn(10), torch.randn(10))
        assert "if b.sum() < 0:" in str(e.value)
        assert "test_seeds.py" in str(e.value)


def test_export_raises_on_break_and_returns_one_graph():
    with pytest.raises(kiln.Unsupported):
        kiln.export(bar, torch.randn(10), torch.randn(10))
    gm, guards = kiln.export(foo, torch.randn(3), torch.randn(3))
    # the graph takes the tensors foo reads (y is unused) and returns its outputs
    assert gm.meta["input_sources"] == ["L['x']"]
    x = torch.randn(3)
    (out,) = gm(x)
    torch.testing.assert_close(out, foo(x, x))
    assert any("L['x'].shape == (3,)" in g.description for g in guards)


def test_resnet18_has_no_break_with_nopython():
    torchvision = pytest.importorskip("torchvision")
    m = torchvision.models.resnet18().eval()
    opt = kiln.optimize("eager", nopython=True)(m)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(opt(x), m(x), rtol=0, atol=0)


def test_run_uses_existing_entries_only():
    opt = kiln.compile(bar, backend="eager")
    opt(torch.randn(10), torch.randn(10).abs())
    frozen = kiln.run(opt)
    a, b = torch.randn(10), torch.randn(10)
    torch.testing.assert_close(frozen(a, b), bar(a, b))
    # a new shape is not compiled; it runs eagerly and stays correct
    a, b = torch.randn(7), torch.randn(7)
    n = len(frozen.entries)
    torch.testing.assert_close(frozen(a, b), bar(a, b))
    assert len(frozen.entries) == n


def test_numpy_in_function_is_a_break_not_wrong():
    def g(x):
        y = x.numpy()
        return torch.from_numpy(np.sin(y)) + 1

    opt = kiln.compile(g, backend="eager")
    x = torch.randn(4)
    torch.testing.assert_close(opt(x), g(x))
