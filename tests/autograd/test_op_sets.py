"""Op-set profiles: aot_eager keeps ops with efficient aten kernels whole (batch norm,
layer norm, softmax, attention) while the kernel compiler's "core" profile decomposes
them; both give eager's results. Attention is one ``kiln.sdpa`` op with a fused
backward under aot_eager."""
from __future__ import annotations

import collections

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from kiln.autograd import aot_compile, verify_aten_graph
from kiln.autograd.backend import aot_eager
from tests.autograd.helpers import (assert_close, clone_inputs, compare_module,
                                    grads_of, lift)
from tests.autograd.test_aot_eager import ConvBN, MLP

aten = torch.ops.aten


def _ops(gm):
    return collections.Counter(n.target for n in gm.graph.nodes if n.op == "call_function")


def _graphs(fn):
    gms = []
    for e in fn._training.values():
        gms += [e.fw_module, e.bw_module]
    if fn._inference is not None:
        gms.append(fn._inference.module)
    return gms


def _core(gm, ex):
    return aot_compile(gm, ex, decompositions="core")


BATCH_NORMS = {aten.native_batch_norm.default, aten._native_batch_norm_legit_functional.default,
               aten._native_batch_norm_legit_no_training.default,
               aten.native_batch_norm_backward.default}


def test_aot_eager_keeps_batch_norm_whole_in_eval():
    torch.manual_seed(0)
    m = ConvBN().eval()
    with torch.no_grad():
        fn = compare_module(m, [torch.randn(2, 3, 10, 10)], aot_eager, rtol=1e-4)
    ops = _ops(fn._inference.module)
    assert ops[aten.native_batch_norm.default] == 2
    assert ops[aten.convolution.default] == 2
    # no decomposed pieces: batch norm eval is one op, not sub/mul/rsqrt/add
    assert aten.rsqrt.default not in ops and aten.sub.Tensor not in ops


def test_aot_eager_keeps_batch_norm_whole_in_training():
    torch.manual_seed(0)
    fn = compare_module(ConvBN().train(), [torch.randn(4, 3, 10, 10)], aot_eager,
                        rtol=1e-4, atol=1e-5)
    entry, = fn._training.values()
    fw, bw = _ops(entry.fw_module), _ops(entry.bw_module)
    # the running-stat update is the functional twin's extra outputs
    assert fw[aten._native_batch_norm_legit_functional.default] == 2
    assert bw[aten.native_batch_norm_backward.default] == 2
    assert bw[aten.convolution_backward.default] == 2
    for g in (entry.fw_module, entry.bw_module):
        verify_aten_graph(g, "eager")


def test_core_profile_still_decomposes_batch_norm():
    torch.manual_seed(0)
    for train in (True, False):
        m = ConvBN().train(train)
        with torch.set_grad_enabled(train):
            fn = compare_module(m, [torch.randn(4, 3, 10, 10)], _core, rtol=1e-4, atol=1e-5)
        for g in _graphs(fn):
            verify_aten_graph(g)            # the core op set
            assert not BATCH_NORMS & set(_ops(g))


class Block(nn.Module):
    """LayerNorm, attention through F.scaled_dot_product_attention, GELU, softmax."""

    def __init__(self, d=32, heads=4, causal=True):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.heads, self.causal = heads, causal

    def forward(self, x):
        b, l, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, dim=2)
        q, k, v = (t.view(b, l, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        a = a.transpose(1, 2).reshape(b, l, d)
        h = x + self.proj(a)
        return F.gelu(h) + F.softmax(h, dim=-1)


@pytest.mark.parametrize("compiler", [aot_eager, _core], ids=["eager", "core"])
def test_block_matches_eager(compiler):
    torch.manual_seed(0)
    m = Block().double()
    x = torch.randn(2, 8, 32, dtype=torch.float64, requires_grad=True)
    fn = compare_module(m, [x], compiler, rtol=1e-7, atol=1e-8)
    for g in _graphs(fn):
        verify_aten_graph(g, fn.ops)


def test_aot_eager_keeps_attention_layer_norm_gelu_softmax_whole():
    torch.manual_seed(0)
    fn = compare_module(Block(), [torch.randn(2, 12, 32, requires_grad=True)], aot_eager,
                        rtol=1e-5, atol=1e-5)
    entry, = fn._training.values()
    fw, bw = _ops(entry.fw_module), _ops(entry.bw_module)
    # the CPU flash kernel: its forward saves the logsumexp, its backward reads it
    assert fw[torch.ops.kiln.sdpa_fused.default] == 1
    assert bw[torch.ops.kiln.sdpa_fused_backward.default] == 1
    assert torch.ops.kiln.sdpa_backward.default not in bw          # no recompute
    assert aten.bmm.default not in fw and aten.bmm.default not in bw   # no math path
    assert fw[aten.native_layer_norm.default] == 1
    assert bw[aten.native_layer_norm_backward.default] == 1
    assert fw[aten._softmax.default] == 1 and fw[aten.gelu.default] == 1
    assert bw[aten._softmax_backward_data.default] == 1
    assert bw[aten.gelu_backward.default] == 1
    # nothing of size L x S is saved for the backward
    assert all(n.meta["val"].shape[-2:] != (12, 12) for n in entry.bw_module.graph.nodes
               if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor))


def _attention_case(mask, gqa=False, causal=False, scale=None):
    def f(q, k, v, m):
        kw = {"enable_gqa": True} if gqa else {}
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal,
                                               scale=scale, **kw) * 2,)
    return f


@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_mask_grad",
                                  "scale", "gqa"])
def test_whole_attention_values_and_gradients(case):
    torch.manual_seed(0)
    b, h, l, s, e = 2, 4, 6, 7, 8
    hk = 2 if case == "gqa" else h
    q = torch.randn(b, h, l, e, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, hk, s, e, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, hk, s, e + 2, dtype=torch.float64, requires_grad=True)
    mask = None
    if case == "bool_mask":
        mask = torch.rand(l, s) > 0.3
        mask[:, 0] = True
    elif case == "float_mask_grad":
        mask = torch.randn(b, 1, l, s, dtype=torch.float64, requires_grad=True)
    f = _attention_case(mask, gqa=case == "gqa", causal=case == "causal",
                        scale=0.3 if case == "scale" else None)
    gm = fx.symbolic_trace(f)
    args = [q, k, v, mask]
    a, r = clone_inputs(args), clone_inputs(args)
    fn = aot_eager(gm, a)
    out, ref = fn(*a), f(*r)
    assert_close(out[0], ref[0], rtol=1e-10, atol=1e-10)
    for x, y in zip(grads_of(out, a), grads_of(ref, r)):
        assert_close(x, y, rtol=1e-9, atol=1e-10)
    entry, = fn._training.values()
    fused = case in ("plain", "causal", "bool_mask", "scale") and torch._fused_sdp_choice(
        q, k, v, mask, 0.0, case == "causal", scale=None, enable_gqa=False) == 1
    fw_op, bw_op = ((torch.ops.kiln.sdpa_fused.default, torch.ops.kiln.sdpa_fused_backward.default)
                    if fused else (torch.ops.kiln.sdpa.default, torch.ops.kiln.sdpa_backward.default))
    assert _ops(entry.fw_module)[fw_op] == 1
    assert _ops(entry.bw_module)[bw_op] == 1
    with torch.no_grad():                        # and the inference graph
        out2 = fn(*a)
    assert_close(out2[0], ref[0], rtol=1e-10, atol=1e-10)
    assert _ops(fn._inference.module)[torch.ops.kiln.sdpa.default] == 1


def test_attention_with_dropout_takes_the_math_path():
    # Recomputing attention in the backward would draw a new dropout mask: with
    # dropout_p > 0 the math path is traced instead (one recorded random draw).
    def f(q):
        return (F.scaled_dot_product_attention(q, q, q, dropout_p=0.5),)
    q = torch.randn(2, 2, 5, 4, requires_grad=True)
    fn = aot_eager(fx.symbolic_trace(f), [q])
    torch.manual_seed(1)
    out, = fn(q)
    out.sum().backward()
    entry, = fn._training.values()
    assert torch.ops.kiln.sdpa.default not in _ops(entry.fw_module)


def test_attention_output_layout_is_the_recorded_one():
    # kiln.sdpa fixes its output strides at trace time, whatever kernel runs, so the
    # view ops recorded after it stay valid.
    from kiln.autograd.sdpa import BLHE, CONTIGUOUS
    q = torch.randn(2, 3, 5, 4)
    for layout in (BLHE, CONTIGUOUS):
        out = torch.ops.kiln.sdpa(q, q, q, None, 0.0, False, None, False, layout)
        meta = torch.ops.kiln.sdpa(q.to("meta"), q.to("meta"), q.to("meta"), None, 0.0,
                                   False, None, False, layout)
        assert out.stride() == meta.stride()
        assert_close(out, F.scaled_dot_product_attention(q, q, q))
    assert torch.ops.kiln.sdpa(q, q, q, layout=BLHE).transpose(1, 2).is_contiguous()


def test_mlp_both_profiles():
    torch.manual_seed(0)
    for compiler in (aot_eager, _core):
        compare_module(MLP(), [torch.randn(8, 16, requires_grad=True)], compiler)


def test_unknown_profile_is_an_error():
    gm, state = lift(MLP())
    with pytest.raises(ValueError, match="unknown decomposition profile"):
        aot_compile(gm, [*state, torch.randn(2, 16)], decompositions="nope")


def test_eager_calls_use_eager_bindings_for_the_same_op():
    from kiln.autograd.eager_calls import eager_calls
    torch.manual_seed(0)
    m = ConvBN().eval()
    gm, state = lift(m)
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        fn = aot_eager(gm, [*state, x])
        fast = fn._inference.fn
        assert fast is not fn._inference.module          # the aten graph is kept
        kinds = {n.target: n.op for n in fast.graph.nodes if n.op.startswith("call")}
        assert torch._C._VariableFunctions.convolution in kinds
        assert torch._C._VariableFunctions.native_batch_norm in kinds
        assert not any(isinstance(t, torch._ops.OpOverload) for t in kinds)
        assert_close(fn(*state, x)[0], m(x), rtol=1e-5, atol=1e-6)
    # A binding that reaches another op (reshape decomposes to view) is not used.
    g = fx.Graph()
    p = g.placeholder("x")
    p.meta["val"] = torch.empty(2, 3, device="meta")
    r = g.call_function(aten.reshape.default, (p, [6]))
    g.output((r,))
    out = eager_calls(fx.GraphModule(torch.nn.Module(), g))
    node, = [n for n in out.graph.nodes if n.op.startswith("call")]
    assert node.target is aten.reshape.default


def test_core_op_set_with_whole_attention():
    # What a kernel backend can ask for: the core op set, attention left to the
    # library (kiln.sdpa / kiln.sdpa_backward added to the verifier's set).
    import dataclasses

    from kiln.autograd import CORE, CORE_OPS
    from kiln.autograd.sdpa import SDPA_FUSED, SDPA_FUSED_BACKWARD
    ops = dataclasses.replace(CORE, name="core+attention", whole_attention=True,
                              allowed=CORE_OPS | {SDPA_FUSED, SDPA_FUSED_BACKWARD})
    torch.manual_seed(0)
    fn = compare_module(Block().double(),
                        [torch.randn(2, 8, 32, dtype=torch.float64, requires_grad=True)],
                        lambda gm, ex: aot_compile(gm, ex, decompositions=ops),
                        rtol=1e-7, atol=1e-8)
    entry, = fn._training.values()
    for g in (entry.fw_module, entry.bw_module):
        verify_aten_graph(g, ops)
    assert _ops(entry.fw_module)[SDPA_FUSED] == 1
    assert _ops(entry.bw_module)[SDPA_FUSED_BACKWARD] == 1
    assert aten.bmm.default not in _ops(entry.fw_module)


def test_whole_attention_gradients_keep_the_layout_views_rely_on():
    """q, k, v are transposed views of projections (T5, Swin): the backward permutes
    their gradients back and *views* them, which is only valid in the layout the meta
    kernel promised (empty_like of the input), not in the fused kernel's own."""
    import kiln

    def f(x, wq, wk, wv, bias):
        b, s, h, d = 2, 16, 2, 8
        q = (x @ wq).view(b, -1, h, d).transpose(1, 2)
        k = (x @ wk).view(b, -1, h, d).transpose(1, 2)
        v = (x @ wv).view(b, -1, h, d).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)
        return out.transpose(1, 2).contiguous().view(b, s, h * d)

    torch.manual_seed(0)
    ins = [torch.randn(2, 16, 16, requires_grad=True)] + \
        [torch.randn(16, 16, requires_grad=True) for _ in range(3)] + \
        [torch.randn(1, 2, 16, 16, requires_grad=True)]
    f(*ins).pow(2).sum().backward()
    ref = [t.grad.clone() for t in ins]
    for t in ins:
        t.grad = None
    kiln.compile(f, backend="aot_eager", fullgraph=True)(*ins).pow(2).sum().backward()
    torch.testing.assert_close([t.grad for t in ins], ref, rtol=1e-4, atol=1e-4)


def test_attention_backward_gives_the_fused_kernels_a_dense_mask(monkeypatch):
    """The backward gets a saved mask back as a broadcast view (bert's: strides
    (0, 512, 1, 0)); PyTorch's fused CUDA kernels refuse a mask whose last dim is not
    dense and take the math path (bert fp32 training: 24 more matmuls a step). The
    mask reaches scaled_dot_product_attention dense, and the gradients are unchanged."""
    import torch.nn.functional as F
    from kiln.autograd import sdpa
    seen = []
    orig = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append(attn_mask.stride())
        return orig(q, k, v, attn_mask=attn_mask, **kw)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 8, 4) for _ in range(3))
    mask = (torch.rand(8, 1) > 0.3).expand(2, 1, 8, 8)       # last-dim stride 0
    g = torch.randn(2, 3, 8, 4)
    got = sdpa._sdpa_backward(g, q, k, v, mask, 0.0, False, None, False, False)
    assert seen and seen[-1][-1] == 1
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    want = torch.autograd.grad(orig(qq, kk, vv, attn_mask=mask), (qq, kk, vv), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask", ["none", "bool", "float"])
def test_fused_attention_backward_reads_the_saved_logsumexp(dtype, mask, monkeypatch):
    """Training runs the fused kernel's own backward from the logsumexp its forward
    saved (``kiln.sdpa_fused``), as eager's autograd does: no attention forward runs in
    the backward, and outputs and gradients are eager's to the bit (the CPU flash kernel
    is deterministic)."""
    import kiln
    from kiln.autograd import sdpa

    def f(x, w, m):
        b, l, d = x.shape
        q, k, v = (x @ w).split(d, dim=2)
        q, k, v = (t.view(b, l, 2, d // 2).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        return out.transpose(1, 2).reshape(b, l, d)

    torch.manual_seed(0)
    x = torch.randn(2, 24, 16, dtype=dtype, requires_grad=True)
    w = torch.randn(16, 48, dtype=dtype, requires_grad=True)
    m = {"none": None, "bool": torch.rand(2, 1, 24, 24) > 0.2,
         "float": torch.randn(2, 1, 1, 24, dtype=dtype)}[mask]
    ref = f(x, w, m)
    g = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (x, w), g)
    calls = []

    class Recorder:                  # the attention kernels sdpa.py calls, by name
        def __getattr__(self, name):
            if name.startswith("_scaled_dot_product"):
                calls.append(name)
            return getattr(aten, name)
    monkeypatch.setattr(sdpa, "aten", Recorder())
    out = kiln.compile(f, backend="aot_eager", fullgraph=True)(x, w, m)
    fwd = "_scaled_dot_product_flash_attention_for_cpu"
    assert calls == [fwd]
    got = torch.autograd.grad(out, (x, w), g)
    assert calls == [fwd, fwd + "_backward"]       # the backward ran no forward
    assert torch.equal(out, ref)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_fused_attention_ops_meta_match_the_kernels():
    """Outputs and logsumexp of ``kiln.sdpa_fused`` have the strides its meta kernel
    promised (later ops in the graph rely on them), whatever the kernel returns."""
    from kiln.autograd.sdpa import BLHE, CONTIGUOUS, FLASH, SDPA_FUSED, SDPA_FUSED_BACKWARD
    q = torch.randn(2, 5, 3, 4).transpose(1, 2)          # (B, H, L, E) in BLHE layout
    for layout in (BLHE, CONTIGUOUS):
        real = SDPA_FUSED(q, q, q, None, False, None, FLASH, layout)
        meta = SDPA_FUSED(*(t.to("meta") for t in (q, q, q)), None, False, None, FLASH, layout)
        for a, b in zip(real, meta):
            assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
        grads = SDPA_FUSED_BACKWARD(torch.randn_like(real[0]), q, q, q, None, *real, False,
                                    None, FLASH)
        assert all(gr.stride() == q.stride() for gr in grads)


def test_a_decomposition_refusing_arguments_leaves_the_op_to_its_kernel():
    """torch._refs.addcmul refuses a float ``value`` for integer tensors, which eager's
    kernel takes (truncating it); the op is then recorded whole (the core op set), and
    raises only where its own kernel does (integer addcdiv: RuntimeError in eager too)."""
    import kiln

    for op in ("addcmul", "addcdiv"):
        def f(a, x):
            return getattr(torch, op)(a, a, a, value=0.5), x.sin()

        results = []
        for fn in (f, kiln.compile(f, backend="kiln")):
            a, x = torch.tensor([1, 2, 3]), torch.randn(3, requires_grad=True)
            try:
                results.append(fn(a, x)[0])
            except RuntimeError as e:
                results.append(type(e))
        if isinstance(results[0], torch.Tensor):
            torch.testing.assert_close(results[1], results[0])
        else:
            assert results[1] is results[0], op
