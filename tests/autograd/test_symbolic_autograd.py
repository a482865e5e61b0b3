"""Symbolic sizes through kiln's autograd stage: a stream of sizes through one
autograd trace (aot_eager), each call's outputs and gradients (inputs and parameters)
compared with eager, the number of autograd traces counted."""
import logging

import pytest
import torch
import torch.nn.functional as F

import kiln

BACKENDS = ["aot_eager", pytest.param("kiln", marks=pytest.mark.slow)]


@pytest.fixture(autouse=True)
def _strict():
    with kiln.config.patch(suppress_errors=False):
        yield
    kiln.reset()


def _leaves(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
            else a for a in args]


def _float64_grads(fn, args, seed):
    """The inputs' gradients of ``fn`` run in float64 (None for an input without)."""
    leaves = [a.detach().double().requires_grad_(a.requires_grad)
              if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    _backward(fn(*leaves), seed)
    return [a.grad if isinstance(a, torch.Tensor) else None for a in leaves]


def _as_close_as_eager(got, eager, exact):
    """A gradient through a softmax of large logits (cancellations) rounds differently
    per reduction order by more than a fixed float32 tolerance, here and in ATen's
    AVX-512 kernels alike: then the compiled one must be within a few of eager's own
    errors of float64."""
    err = (got.double() - exact).abs().max()
    err_eager = (eager.double() - exact).abs().max()
    assert err <= 4 * err_eager + 1e-6 * exact.abs().max(), (float(err), float(err_eager))


def _backward(out, seed):
    outs = out if isinstance(out, (tuple, list)) else (out,)
    g = torch.Generator().manual_seed(seed)
    total = sum((o * torch.randn(o.shape, generator=g)).sum() for o in outs
                if isinstance(o, torch.Tensor) and o.requires_grad)
    total.backward()


def stream(fn, make, sizes, backend, module=None, **kw):
    """``fn`` compiled; per size, outputs and gradients of the inputs and of
    ``module``'s parameters compared with eager's."""
    c = kiln.compile(fn, backend=backend, **kw)
    params = list(module.parameters()) if module is not None else []
    for k, s in enumerate(sizes):
        torch.manual_seed(k)
        args = make(s)
        ref_args, got_args = _leaves(args), _leaves(args)
        ref = fn(*ref_args)
        _backward(ref, k)
        ref_pgrads = [p.grad.clone() for p in params]
        for p in params:
            p.grad = None
        got = c(*got_args)
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
        _backward(got, k)
        exact = None
        for i, (a, b) in enumerate(zip(got_args, ref_args)):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                try:
                    torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
                except AssertionError:
                    if module is not None:
                        raise
                    exact = exact or _float64_grads(fn, args, k)
                    _as_close_as_eager(a.grad, b.grad, exact[i])
        for p, r in zip(params, ref_pgrads):
            torch.testing.assert_close(p.grad, r, rtol=1e-4, atol=1e-5)
            p.grad = None
    assert c.skip is None, c.skip
    return c


def graphs(c) -> int:
    return sum(len(e.graphs) for e in c.entries)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _norms(x):
    s = x.shape[1]
    return (F.layer_norm(torch.softmax(x, 1), (8,)),
            F.layer_norm(x.transpose(1, 2), (s,)).log_softmax(-1))


def _heads(x, w):
    b, s, d = x.shape
    h = 2
    q = (x @ w).view(b, s, h, d // h).transpose(1, 2)         # (b, h, s, d/h)
    att = torch.softmax(q @ q.transpose(-1, -2) / 2.0, -1)
    return (att @ q).transpose(1, 2).reshape(b * s, d)


def _slices(x):
    n = x.size(0)
    return x[: n // 2] * 2 + x[n - n // 2:].sin(), x[1: n - 1].sum(0)


def _matmuls(x, w1, w2):
    return torch.relu(x @ w1) @ w2, (x @ w1).sum(1)


CASES = {
    "norms": (_norms, lambda s: (torch.randn(2, s, 8, requires_grad=True),), [3, 5, 6, 9]),
    "heads": (_heads, lambda s: (torch.randn(2, s, 8, requires_grad=True),
                                 torch.randn(8, 8, requires_grad=True)), [3, 4, 7, 10]),
    "slices": (_slices, lambda s: (torch.randn(s, 5, requires_grad=True),), [4, 6, 7, 10]),
    "matmuls": (_matmuls, lambda s: (torch.randn(2, s, 8, requires_grad=True),
                                     torch.randn(8, 16, requires_grad=True),
                                     torch.randn(16, 4, requires_grad=True)), [3, 5, 8, 11]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(CASES))
def test_one_autograd_trace_for_a_stream_of_sizes(name, backend, traces):
    fn, make, sizes = CASES[name]
    c = stream(fn, make, sizes, backend, dynamic=True)
    assert graphs(c) == 1
    assert traces[0] == 1       # kiln: then compiled per size, after the autograd stage


@pytest.mark.parametrize("backend", BACKENDS)
def test_mlp_with_a_variable_batch(backend, traces):
    m = _mlp()
    c = stream(lambda x: m(x), lambda s: (torch.randn(s, 8, requires_grad=True),),
               [3, 5, 7, 12, 33], backend, module=m)
    assert graphs(c) == 2       # automatic: the second size makes the batch dynamic
    assert traces[0] == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_int_argument(backend, traces):
    def f(x, n):
        return x[:n] * n + x.sum(0), x.view(n, 2, 3).sum(1)
    c = stream(f, lambda s: (torch.randn(2 * s, 3, requires_grad=True), s), [2, 3, 5, 8],
               backend)
    assert graphs(c) == 2
    assert traces[0] == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_mark_dynamic_on_the_first_call(backend, traces):
    m = _mlp()

    def make(s):
        x = torch.randn(s, 8, requires_grad=True)
        return (x,)
    c = kiln.compile(lambda x: m(x), backend=backend)
    for k, s in enumerate([4, 6, 9]):
        (x,) = make(s)
        kiln.mark_dynamic(x, 0)
        x2 = x.detach().clone().requires_grad_(True)
        got = c(x)
        _backward(got, k)
        gp = [p.grad.clone() for p in m.parameters()]
        m.zero_grad(set_to_none=True)
        ref = m(x2)
        _backward(ref, k)
        torch.testing.assert_close(got, ref)
        torch.testing.assert_close(x.grad, x2.grad)
        for a, p in zip(gp, m.parameters()):
            torch.testing.assert_close(a, p.grad)
        m.zero_grad(set_to_none=True)
    assert graphs(c) == 1
    assert traces[0] == 1


def test_inference_path_is_traced_once(traces):
    m = _mlp()
    c = kiln.compile(m, backend="aot_eager", dynamic=True)
    with torch.no_grad():
        for s in [3, 5, 9]:
            x = torch.randn(s, 8)
            torch.testing.assert_close(c(x), m(x))
    assert traces[0] == 1


def _logging(caplog, artefact):
    logger = logging.getLogger(f"kiln.{artefact}")
    old = logger.level
    logger.setLevel(logging.INFO)
    return old, logger, caplog.at_level(logging.INFO, logger=f"kiln.{artefact}")


def test_symbolic_graphs_are_printed_with_size_names(caplog):
    def f(x):
        b, s, d = x.shape
        return x.view(b * s, d).exp()
    c = kiln.compile(f, backend="aot_eager", dynamic=True)
    old, logger, ctx = _logging(caplog, "aot_graphs")
    try:
        with ctx:
            c(torch.randn(2, 5, 8, requires_grad=True)).sum().backward()
    finally:
        logger.setLevel(old)
    text = caplog.text
    assert 'f32[s0, s1, s2]' in text and "backward graph" in text
    assert "torch.ops.aten.sym_size.int(primals_1, 0)" in text


def test_a_size_the_backward_needs_is_saved_as_an_int():
    from kiln.autograd.runtime import aot_compile
    from kiln.autograd.symbolic import symbolic_examples

    def f(x):
        b, s = x.shape
        return (x.view(b * s) * 2).view(s, b).exp()
    captured = []

    def backend(gm, example_inputs):
        captured.append((gm, example_inputs))
        return gm.forward
    kiln.compile(f, backend=backend, dynamic=True)(torch.randn(4, 3))
    gm, examples = captured[0]
    examples = [examples[0].clone().requires_grad_(True)]
    fn = aot_compile(gm, examples, symbolic=symbolic_examples(gm, examples))
    (training,) = fn._training.values()
    saved = [n for n in training.bw_module.graph.nodes if n.op == "placeholder"
             and not n.name.startswith("tangents")]
    assert any(isinstance(n.meta["val"], torch.SymInt) for n in saved)
    for k, (b, s) in enumerate([(4, 3), (5, 7), (2, 9)]):
        x = torch.randn(b, s, requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        (got,) = fn(x)
        _backward(got, k)
        ref = f(x2)
        _backward(ref, k)
        torch.testing.assert_close(got, ref)
        torch.testing.assert_close(x.grad, x2.grad)


def test_an_assumption_the_capture_did_not_make_traces_per_size(monkeypatch, traces, caplog):
    """A question the autograd trace asks that the capture's guards do not answer makes
    that graph trace per size (logged), never a graph valid for fewer sizes."""
    from kiln.autograd import symbolic

    monkeypatch.setattr(symbolic, "new_assumptions", lambda env, before: ["s0 == 5"])
    m = _mlp()
    old, logger, ctx = _logging(caplog, "fallbacks")
    try:
        with ctx:
            stream(lambda x: m(x), lambda s: (torch.randn(s, 8, requires_grad=True),),
                   [3, 5, 7], "aot_eager", module=m, dynamic=True)
    finally:
        logger.setLevel(old)
    assert traces[0] == 1 + 3       # the refused symbolic trace, then one per size
    assert "per size" in caplog.text and "s0 == 5" in caplog.text


def test_a_question_the_capture_did_not_ask_traces_per_size(traces, caplog):
    """Convolution and pooling backwards ask whether output sizes are nonzero, which
    the capture's guards do not settle (``(s - 1) // 2`` is 0 at s == 2): the graph is
    traced per size, and every size (2 among them) matches eager."""
    w = torch.randn(4, 3, 3, 3, requires_grad=True)

    def f(x):
        return F.max_pool2d(F.conv2d(x, w, stride=2, padding=1), 2, ceil_mode=True)
    old, logger, ctx = _logging(caplog, "fallbacks")
    try:
        with ctx:
            stream(f, lambda s: (torch.randn(2, 3, s, s + 1, requires_grad=True),),
                   [6, 3, 2, 9], "aot_eager", dynamic=True)
    finally:
        logger.setLevel(old)
    assert "per size" in caplog.text
    assert traces[0] > 1


def test_concrete_compilers_get_each_size_once_after_one_trace(traces):
    """``specialize``: a compiler of plain int sizes (the kernel compiler's contract) gets
    per size signature a graph with no symbolic size left, int inputs and outputs taken
    out; every size compiled, ``dynamic_specializations`` of them kept (least recently
    used dropped); once the stream has cycled past the bound, new sizes run the symbolic
    graph itself (and still match eager)."""
    from kiln.autograd.runtime import aot_compile

    def f(x, n):
        b, s = x.shape
        return (x.view(b * s) * n).view(s, b).exp()
    captured = []

    def backend(gm, example_inputs):
        captured.append((gm, example_inputs))
        return gm.forward
    kiln.compile(f, backend=backend, dynamic=True)(torch.randn(4, 3), 5)
    gm, examples = captured[0]
    compiled = {"fw": [], "bw": []}

    def concrete(kind, g, example_inputs):
        for node in g.graph.nodes:
            vals = node.meta.get("val")
            for v in (vals if isinstance(vals, (tuple, list)) else (vals,)):
                assert not isinstance(v, torch.SymInt), node
                if isinstance(v, torch.Tensor):
                    assert not any(isinstance(d, torch.SymInt) for d in (*v.shape, *v.stride()))
        assert all(isinstance(e, torch.Tensor) for e in example_inputs)
        compiled[kind].append(tuple(tuple(e.shape) for e in example_inputs))
        return g
    x0 = examples[0].clone().requires_grad_(True)
    with kiln.config.patch(dynamic_specializations=2):
        fn = aot_compile(gm, [x0, 5], fw_compiler=lambda g, e: concrete("fw", g, e),
                         bw_compiler=lambda g, e: concrete("bw", g, e))
        stream = [(4, 3, 5), (5, 7, 2), (4, 3, 5), (2, 9, 3), (5, 7, 2), (3, 4, 1), (4, 3, 5)]
        for k, (b, s, n) in enumerate(stream):
            x = torch.randn(b, s, requires_grad=True)
            x2 = x.detach().clone().requires_grad_(True)
            (got,) = fn(x, n)
            _backward(got, k)
            ref = f(x2, n)
            _backward(ref, k)
            torch.testing.assert_close(got, ref)
            torch.testing.assert_close(x.grad, x2.grad)
    assert traces[0] == 1
    # a bound of 2: (4, 3) and (5, 7) compiled, (4, 3) hit; (2, 9) drops (5, 7), which
    # comes back and drops (4, 3); two dropped: the stream cycles, (3, 4) and (4, 3)
    # run uncompiled
    assert [c[0] for c in compiled["fw"]] == [(4, 3), (5, 7), (2, 9), (5, 7)]
    assert len(compiled["bw"]) == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_views_with_symbolic_bounds(backend, traces):
    """Outputs that are views (of an input, of an intermediate) are rebuilt per call
    with the sizes of that call's inputs, aliasing as in eager."""
    def f(x):
        n = x.size(0)
        y = x * 2
        return x[1: n - 1], y[: n // 2].view(-1), y.sum()
    c = kiln.compile(f, backend=backend, dynamic=True)
    for k, s in enumerate([4, 7, 10]):
        x = torch.randn(s, 3, requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        got, ref = c(x), f(x2)
        torch.testing.assert_close(got, ref)
        assert got[0]._base is x and got[0].shape == ref[0].shape
        _backward(got, k)
        _backward(ref, k)
        torch.testing.assert_close(x.grad, x2.grad)
    assert traces[0] == 1


def test_a_backward_for_some_tangents_gets_a_size_only_an_absent_one_gives(tmp_path,
                                                                          monkeypatch):
    """Outputs in one autograd node, the loss reaching only one of them: the backward
    for that tangent still returns a structural zero for ``x0`` (``zeros([s1])``),
    whose size only ``x0``'s own, absent, output gives. The per-size backward takes
    that tangent for its size alone (``grad_parts._size_carriers``); it raised
    ``SymbolicUnsupported`` inside ``backward()``. Gradients as eager's, over sizes."""
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))

    def f(x0, x1):
        v = (x1[torch.tensor([0, 0])] * 2.0).sum(dim=(0,))
        return v, torch.relu(x0) * 2, x1, x0
    cf = kiln.compile(f, dynamic=True)
    for n in (5, 7, 9):
        grads = []
        for fn in (f, cf):
            x0 = torch.linspace(-1, 1, n, requires_grad=True)
            x1 = torch.linspace(-2, 3, n, requires_grad=True)
            fn(x0, x1)[0].backward()
            grads.append((x0.grad, x1.grad))
        (e0, e1), (c0, c1) = grads
        assert e0 is None and c0 is None
        torch.testing.assert_close(c1, e1)
