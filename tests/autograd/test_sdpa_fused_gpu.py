"""Training attention on the GPU runs the fused kernel eager picks — forward saving its
logsumexp, backward reading it (``kiln.sdpa_fused``) — for each CUDA kernel kiln calls
itself: memory-efficient (fp32), cuDNN (half precision, where PyTorch prefers it) and
flash (half precision with cuDNN attention off). Outputs match eager's to the bit; so
do the key and value gradients; the query gradient of the efficient and cuDNN kernels
is summed with atomics, so eager's own differs from run to run, and it is compared
within that spread."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln.autograd.sdpa import CUDNN, EFFICIENT, FLASH

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (runs on the GPU machine)")
aten = torch.ops.aten
CASES = {  # name: dtype, mask kind, causal, cuDNN attention on
    "fp32_float_mask": (torch.float32, "float", False, True),
    "fp32_causal": (torch.float32, None, True, True),
    "bf16_broadcast_mask": (torch.bfloat16, "broadcast", False, True),
    "bf16_causal": (torch.bfloat16, None, True, True),
    "fp16_bool_mask": (torch.float16, "bool", False, True),
    "bf16_causal_flash": (torch.bfloat16, None, True, False),
    "bf16_odd_length_flash": (torch.bfloat16, None, False, False),
}


def _inputs(dtype, mask_kind, length):
    b, h, e = 2, 4, 64
    q, k, v = (torch.randn(b, length, h, e, device="cuda", dtype=dtype).transpose(1, 2)
               .requires_grad_() for _ in range(3))
    mask = {None: None,
            "float": torch.randn(b, h, length, length, device="cuda", dtype=dtype),
            "broadcast": torch.randn(b, 1, 1, length, device="cuda", dtype=dtype),
            "bool": torch.rand(b, 1, length, length, device="cuda") > 0.2}[mask_kind]
    return q, k, v, mask


def _record_kernel_calls(monkeypatch) -> list:
    """The attention kernels ``sdpa.py`` calls from now on, by aten name."""
    from kiln.autograd import sdpa
    calls = []

    class Recorder:
        def __getattr__(self, name):
            if name.startswith("_scaled_dot_product"):
                calls.append(name)
            return getattr(aten, name)
    monkeypatch.setattr(sdpa, "aten", Recorder())
    return calls


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_attention_training_matches_eager(case, backend, monkeypatch):
    import kiln
    dtype, mask_kind, causal, cudnn = CASES[case]
    if not cudnn:
        torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        length = 77 if "odd" in case else 128
        torch.manual_seed(0)
        q, k, v, mask = _inputs(dtype, mask_kind, length)

        def f(q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal) * 2

        want_kernel = torch._fused_sdp_choice(q, k, v, mask, 0.0, causal, scale=None,
                                              enable_gqa=False)
        assert want_kernel in (FLASH, EFFICIENT, CUDNN)
        ref = f(q, k, v, mask)
        g = torch.randn_like(ref)
        want = torch.autograd.grad(ref, (q, k, v), g)
        again = torch.autograd.grad(f(q, k, v, mask), (q, k, v), g)
        calls = _record_kernel_calls(monkeypatch)
        compiled = kiln.compile(f, backend=backend, fullgraph=True)
        out = compiled(q, k, v, mask)
        name = {FLASH: "flash", EFFICIENT: "efficient", CUDNN: "cudnn"}[want_kernel]
        assert calls == [f"_scaled_dot_product_{name}_attention"]
        got = torch.autograd.grad(out, (q, k, v), g)
        assert calls == [f"_scaled_dot_product_{name}_attention",          # no recompute
                         f"_scaled_dot_product_{name}_attention_backward"]
        assert torch.equal(out, ref)
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
        spread = (again[0].float() - want[0].float()).abs().max().item()
        assert (got[0].float() - want[0].float()).abs().max().item() <= spread * 4 + \
            (1e-6 if dtype == torch.float32 else 1e-3)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def test_trace_names_the_kernel_eager_picks():
    """``fused_kernel`` asks PyTorch on empty tensors of the traced layouts: its answer
    is the one eager gets for the real tensors."""
    from kiln.autograd.sdpa import fused_kernel
    for dtype, mask_kind, causal, _ in CASES.values():
        q, k, v, mask = _inputs(dtype, mask_kind, 128)
        metas = [t.to("meta").requires_grad_(t.requires_grad) if t is not None else None
                 for t in (q, k, v, mask)]
        got = fused_kernel(*metas, causal, None, q.device)
        assert got == torch._fused_sdp_choice(q, k, v, mask, 0.0, causal, scale=None,
                                              enable_gqa=False)
