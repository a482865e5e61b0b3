"""Soundness of shape propagation, decompositions and the kernel backend: what a
compiled program returns is what eager returns (values, dtypes, shapes, strides,
layouts, aliasing, gradients), or the program runs eagerly; never another answer,
another exception, or a crash. Each test runs on every backend where it can."""
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import kiln
from kiln.autograd.trace import trace_joint
from kiln.capture.fake import FakeTensor
from kiln.kernels import ir
from kiln.kernels.lowering import GraphLowering

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BACKENDS = ["eager", "aot_eager", "kiln"]
sys.path.insert(0, HERE)
import soundness_edge_cases  # noqa: E402


def _fresh(args, requires_grad=False):
    return [a.detach().clone().requires_grad_(requires_grad and a.is_floating_point())
            if isinstance(a, torch.Tensor) else a for a in args]


def _same(out, ref):
    """Values, dtypes, shapes and strides (of dims that address something)."""
    if isinstance(ref, (tuple, list)):
        assert isinstance(out, (tuple, list)) and len(out) == len(ref)
        for o, r in zip(out, ref):
            _same(o, r)
        return
    if not isinstance(ref, torch.Tensor):
        assert out == ref
        return
    assert (out.dtype, out.shape, out.layout) == (ref.dtype, ref.shape, ref.layout)
    if out.numel() > 1:
        assert out.stride() == ref.stride()
    torch.testing.assert_close(out.detach(), ref.detach(), rtol=1e-5, atol=1e-5,
                               equal_nan=True)


# --- 1. shapes: matmul of every rank, in-place view ops ------------------------------
def _products(v, m, b3, w):
    """Matrix products of every rank combination, and their ranks as traced."""
    outs = (v @ v, v @ m, m.t() @ v, v @ b3, b3.transpose(1, 2) @ v, m.t() @ m,
            b3 @ m.t(), m.t() @ b3, b3[:1] @ b3.transpose(1, 2), v @ b3[:1],
            F.linear(v, w), F.linear(v, w, w[:, 0]), v[:0] @ m[:0], m[:, :0].t() @ v)
    return outs + tuple(o.dim() for o in outs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_matmul_of_every_rank(backend, requires_grad):
    torch.manual_seed(0)
    args = [torch.randn(4), torch.randn(4, 5), torch.randn(2, 4, 5), torch.randn(3, 4)]
    ref = _products(*_fresh(args, requires_grad))
    xs = _fresh(args, requires_grad)
    out = kiln.compile(_products, backend=backend)(*xs)
    _same(out, ref)
    if not requires_grad:
        return
    loss = sum(o.sum() for o in out if isinstance(o, torch.Tensor))
    grads = torch.autograd.grad(loss, xs)
    rs = _fresh(args, True)
    ref_grads = torch.autograd.grad(sum(o.sum() for o in _products(*rs)
                                        if isinstance(o, torch.Tensor)), rs)
    _same(grads, ref_grads)


def _inplace_views(x):
    y = x * 2
    y.unsqueeze_(0)
    n = y.shape[0] + y.dim()
    z = x.clone()
    z.transpose_(0, 1)
    z.mul_(2)
    w = x + 1
    w.t_()
    w.squeeze_()
    return y, n, z.contiguous(), w + 1, z * 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_inplace_view_ops_reshape_their_tensor(backend):
    x = torch.randn(3, 4)
    _same(kiln.compile(_inplace_views, backend=backend)(x.clone()), _inplace_views(x.clone()))


def _reshape_input(x):
    x.unsqueeze_(0)
    return x * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_inplace_view_of_an_input_reshapes_the_callers_tensor(backend):
    x, ref_x = torch.randn(3, 4), None
    ref_x = x.clone()
    ref = _reshape_input(ref_x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = kiln.compile(_reshape_input, backend=backend)(x)
    _same(out, ref)
    assert x.shape == ref_x.shape == (1, 3, 4)


# --- 2. losses with every reduction, and their gradients ----------------------------
def _losses(x, y, p, t, lab, s, reduction):
    r = reduction
    pw = torch.full((3,), 2.0)
    return (F.l1_loss(x, y, reduction=r), F.mse_loss(x, y, reduction=r),
            F.mse_loss(x, 2 * x, reduction=r), F.smooth_l1_loss(x, y, reduction=r, beta=0.5),
            F.huber_loss(x, y, reduction=r, delta=0.7),
            F.binary_cross_entropy(p, t, reduction=r),
            F.binary_cross_entropy(p, t, weight=t + 1, reduction=r),
            F.binary_cross_entropy_with_logits(x, t, reduction=r),
            F.binary_cross_entropy_with_logits(x, t, pos_weight=pw, reduction=r),
            F.nll_loss(F.log_softmax(x, 1), lab, reduction=r),
            F.nll_loss(F.log_softmax(x, 1), lab, weight=pw, reduction=r, ignore_index=2),
            F.cross_entropy(x, lab, reduction=r, label_smoothing=0.1),
            F.cross_entropy(x, t.softmax(1), reduction=r, label_smoothing=0.2),
            F.kl_div(F.log_softmax(x, 1), t.softmax(1),
                     reduction="batchmean" if r == "sum" else r),
            F.soft_margin_loss(x, s, reduction=r),
            F.margin_ranking_loss(x, y, s, margin=0.1, reduction=r),
            F.hinge_embedding_loss(x, s, reduction=r),
            F.poisson_nll_loss(x, t, reduction=r),
            F.gaussian_nll_loss(x, y, p, reduction=r))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_losses_with_every_reduction(backend, reduction):
    torch.manual_seed(0)
    args = [torch.randn(4, 3), torch.randn(4, 3), torch.rand(4, 3).clamp(0.05, 0.95),
            torch.rand(4, 3), torch.tensor([0, 1, 2, 1]),
            torch.randint(0, 2, (4, 3)).float() * 2 - 1]

    def fn(*a):
        return _losses(*a, reduction)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # kl_div's "mean"
        xs, rs = _fresh(args), _fresh(args)
        for a in xs[:3] + rs[:3]:
            a.requires_grad_(True)
        out, ref = kiln.compile(fn, backend=backend)(*xs), fn(*rs)
        _same(out, ref)
        g = torch.autograd.grad(sum(o.sum() for o in out), [xs[0], xs[2]])
        rg = torch.autograd.grad(sum(o.sum() for o in ref), [rs[0], rs[2]])
    _same(g, rg)


# --- 3. outputs share memory only where eager's do ----------------------------------
def _copies(b, c):
    return (b.tile((2,)), b.repeat(1, 2), b.repeat(3, 1), c.repeat(1, 2), c.tile((2, 1)),
            b.expand(3, 1).contiguous(), b.clone(), c.reshape(-1), c.t().reshape(-1),
            torch.zeros(1).expand(3), c + 0, c.contiguous())


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_outputs_alias_exactly_as_eager(backend):
    b, c = torch.randn(1), torch.randn(3, 1)
    ref = _copies(b, c)
    b2, c2 = b.clone(), c.clone()
    out = kiln.compile(_copies, backend=backend)(b2, c2)
    _same(out, ref)

    def storage(t):
        return t.untyped_storage().data_ptr()
    eager_ids = [storage(t) for t in (b, c, *ref)]
    ids = [storage(t) for t in (b2, c2, *out)]
    assert [eager_ids.index(i) for i in eager_ids] == [ids.index(i) for i in ids]
    for k, (o, r) in enumerate(zip(out, ref)):
        if 0 not in r.stride():   # eager's broadcast outputs refuse writes
            o.view(-1)[0] = r.view(-1)[0] = 100.0 + k
    _same((b2, c2, *out), (b, c, *ref))


# --- 4. layouts and devices capture does not model ----------------------------------
_DENSE = torch.randn(3, 4)
_LAYOUTS = {
    "sparse input": (lambda x: x.to_dense() * 2, lambda: _DENSE.to_sparse()),
    "sparse made": (lambda x: x.to_sparse().to_dense() * 2, lambda: _DENSE.clone()),
    "sparse output": (lambda x: (x * 2).to_sparse(), lambda: _DENSE.clone()),
    "csr": (lambda x: x.to_sparse_csr().to_dense() + 1, lambda: _DENSE.clone()),
    "mkldnn": (lambda x: x.to_mkldnn().to_dense() * 2, lambda: _DENSE.clone()),
    "quantized": (lambda x: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)
                  .dequantize() * 2, lambda: _DENSE.clone()),
    "quantized input": (lambda x: x.dequantize() * 2,
                        lambda: torch.quantize_per_tensor(_DENSE, 0.1, 0, torch.qint8)),
    "to meta": (lambda x: x.to("meta") * 2, lambda: _DENSE.clone()),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(_LAYOUTS))
def test_other_layouts_run_as_eager(backend, case):
    fn, make = _LAYOUTS[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = fn(make())
        out = kiln.compile(fn, backend=backend)(make())
    assert (out.layout, out.device, out.dtype, out.shape) == \
        (ref.layout, ref.device, ref.dtype, ref.shape)
    if ref.device.type != "meta":
        torch.testing.assert_close(out.to_dense(), ref.to_dense())


def test_meta_tensors_on_the_kiln_backend():
    """A compiled graph called on meta tensors runs op by op (its C++ kernels would
    read null pointers: a crash, so in a child process)."""
    code = ("import torch, kiln\n"
            "f = kiln.compile(lambda x, w: ((x * 2 + 1) @ w).sum(1).relu(), backend='kiln')\n"
            "for rg in (False, True):\n"
            "    x = torch.empty(3, 4, device='meta', requires_grad=rg)\n"
            "    y = f(x, torch.empty(4, 5, device='meta'))\n"
            "    assert (y.device.type, tuple(y.shape)) == ('meta', (3,)), y\n"
            "    if rg: y.sum().backward()\n"
            "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-3000:]


# --- 5. ops without a lowering run as library calls ---------------------------------
def _linalg(a, v):
    return (torch.linalg.inv(a) + 1, torch.linalg.inv_ex(a)[0] * 2,
            torch.linalg.solve(a, v) + 1, torch.linalg.cholesky(a) * 2,
            torch.linalg.det(a) * 2, torch.linalg.slogdet(a)[1] * 2,
            torch.linalg.eigvalsh(a) + 1, torch.linalg.svdvals(a) * 2,
            torch.linalg.matrix_exp(a * 0.1) * 2, torch.linalg.vector_norm(a, ord=3) * 2,
            torch.cholesky_solve(a, torch.linalg.cholesky(a)) * 2,
            torch.linalg.solve_triangular(a.triu(), a, upper=True) * 2,
            torch.topk(v, 2).values * 2, torch.sort(v).values * 2, torch.cumprod(v, 0) * 2)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_ops_without_lowering_run_as_library_calls(backend):
    torch.manual_seed(0)
    a = torch.randn(3, 3, dtype=torch.float64)
    args = [a @ a.T + 3 * torch.eye(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)]
    xs, rs = _fresh(args, True), _fresh(args, True)
    out, ref = kiln.compile(_linalg, backend=backend)(*xs), _linalg(*rs)
    _same(out, ref)
    _same(torch.autograd.grad(sum(o.sum() for o in out), xs),
          torch.autograd.grad(sum(o.sum() for o in ref), rs))
    singular = torch.zeros(3, 3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="singular"):
        torch.linalg.inv(singular)
    with pytest.raises(RuntimeError, match="singular"):
        kiln.compile(lambda m: torch.linalg.inv(m) + 1, backend=backend)(singular)
    # training: the check that raises is kept in the forward graph by the partitioner
    f = kiln.compile(lambda m: torch.linalg.inv(m) + 1, backend=backend)
    with pytest.raises(RuntimeError, match="singular"):
        f(singular.clone().requires_grad_())
    good = (3 * torch.eye(3, dtype=torch.float64)).requires_grad_()
    _same(f(good), torch.linalg.inv(good) + 1)        # the graph still runs compiled


# --- 6. graphs mixing CPU tensors with an accelerator's ------------------------------
def _mixed(x, s):
    scale = torch.sqrt(torch.tensor(16.0))          # a CPU tensor made in the graph
    return (x * s / scale + 1).relu()


def test_factories_made_from_a_cuda_tensor_stay_on_cuda_beside_cpu_inputs():
    """Dropout's mask is made by ``empty_like(x)``, which reaches the tracer as a
    factory on the meta device: it belongs on ``x``'s CUDA, not on the CPU of a 0-d
    scale that comes first among the inputs (DeBERTa's backward mixed the two)."""
    cuda = torch.device("cuda", 0)
    s = torch.empty((), device="meta")
    x = torch.empty(4, 8, device="meta")
    gm = fx.symbolic_trace(lambda s, x: torch.nn.functional.dropout(x / s, 0.1, True))
    tr = trace_joint(gm, [s, x], train=False, devices=[torch.device("cpu"), cuda])
    factories = [n for n in tr.graph.nodes if n.op == "call_function"
                 and "device" in n.kwargs]
    assert factories
    for n in factories:
        assert n.kwargs["device"] == cuda and n.meta["device"] == cuda, n.format_node()


@pytest.mark.parametrize("order", ["cpu first", "cuda first"])
def test_kernels_never_take_cpu_tensors_beside_cuda_ones(order):
    """Simulated without a GPU: a CUDA input is a fake that reports CUDA. The graph's
    kernels run on CUDA wherever the CPU 0-d tensor comes among the inputs, and every
    op that reads a CPU tensor is a library call (eager's own)."""
    cuda = torch.device("cuda", 0)
    x = torch.empty(4, 8, device="meta")
    s = torch.empty((), device="meta")
    gm = fx.symbolic_trace(_mixed if order == "cuda first" else (lambda s, x: _mixed(x, s)))
    args, devices = ([x, s], [cuda, torch.device("cpu")]) if order == "cuda first" else \
        ([s, x], [torch.device("cpu"), cuda])
    tr = trace_joint(gm, args, train=False, devices=devices)
    root = torch.nn.Module()
    for k, v in tr.constants.items():
        setattr(root, k, v)
    aten_gm = fx.GraphModule(root, tr.graph)
    out_node = [n for n in tr.graph.nodes if n.op == "output"][0].args[0][0]
    assert out_node.meta["device"] == cuda
    for n in tr.graph.nodes:
        if n.op == "call_function" and any(a.meta.get("device") == cuda
                                           for a in n.all_input_nodes):
            assert n.meta["device"] == cuda, n.format_node()
    fakes = [FakeTensor(a, d) for a, d in zip(args, devices)]
    lo = GraphLowering(aten_gm, fakes, "triton").run()
    assert lo.device == cuda
    cpu_inputs = {b.name for b in lo.buffers
                  if isinstance(b, ir.Input) and devices[b.position].type == "cpu"}
    assert cpu_inputs
    for b in lo.buffers:
        if isinstance(b, (ir.Pointwise, ir.Reduction)):
            assert not (set(b.reads()) & cpu_inputs), b


# --- 7. edge values through the kernels ---------------------------------------------
def test_edge_values_through_the_cpp_kernels():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert soundness_edge_cases.mismatches() == []


@pytest.mark.slow      # the Triton interpreter: minutes of the quick subset's budget
def test_edge_values_through_the_triton_kernels(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_KERNEL_TARGET="triton",
               KILN_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(HERE, "soundness_edge_cases.py")],
                       env=env, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]


# --- on a GPU (skipped without one) -------------------------------------------------
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda_only
def test_edge_values_through_the_triton_kernels_on_the_gpu():
    """Also CPU 0-d tensors made in the graph beside CUDA ones (``promotion``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert soundness_edge_cases.mismatches(on_cpu_semantics=False, device="cuda") == []


@cuda_only
@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_cpu_scalars_beside_cuda_tensors_on_the_gpu(backend):
    x = torch.randn(64, 64, device="cuda")
    f_cpu_first = kiln.compile(lambda s, x: _mixed(x, s), backend=backend)
    f_cuda_first = kiln.compile(_mixed, backend=backend)
    for _ in range(12):               # past the CUDA-graph recording: values still read
        s = torch.tensor(float(torch.randint(1, 9, ())))
        _same(f_cpu_first(s, x), _mixed(x, s))
        _same(f_cuda_first(x, s), _mixed(x, s))


@cuda_only
def test_deberta_v2_masked_lm_on_the_gpu():
    """Its graphs mix CPU tensors made in the graph with CUDA ones."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DebertaV2Config(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, relative_attention=True,
        position_buckets=16, max_relative_positions=32, pos_att_type=["p2c", "c2p"])
    torch.manual_seed(0)
    m = transformers.DebertaV2ForMaskedLM(cfg).to("cuda").eval()
    ids = torch.randint(0, 128, (2, 16), device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(m, backend="kiln")(input_ids=ids).logits,
                                   m(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    labels = torch.randint(0, 128, (2, 16), device="cuda")
    grads = []
    for fn in (kiln.compile(m, backend="kiln"), m):
        m.zero_grad()
        loss = fn(input_ids=ids, labels=labels).loss
        loss.backward()
        grads.append([loss.detach()] + [p.grad.clone() for p in m.parameters()
                                        if p.grad is not None])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
