"""H100 probe: PyTorch's fused attention kernels called directly (forward saving the
logsumexp, backward from it) against F.scaled_dot_product_attention + autograd: which
kernel each case gets, the logsumexp's shape, how undefined arguments are passed, and
whether outputs and gradients are bit-equal to eager's."""
import traceback
import torch
import torch.nn.functional as F

aten = torch.ops.aten
torch.manual_seed(0)


def prep_mask(m, q, k, dtype):
    if m is None:
        return None
    if m.dtype == torch.bool:
        m = torch.zeros_like(m, dtype=dtype).masked_fill(~m, float("-inf"))
    aligned = m.stride(-1) == 1 and all(s % 8 == 0 for s in m.stride()[:-1])
    if not aligned:
        n = m.shape[-1]
        m = F.pad(m, (0, 8 - n % 8))[..., :n]
    return m.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


cases = [  # name, B, H, L, S, E, dtype, mask kind, causal
    ("bert_fp32", 8, 12, 512, 512, 64, torch.float32, "bcast", False),
    ("bert_bf16", 8, 12, 512, 512, 64, torch.bfloat16, "bcast", False),
    ("gpt2_fp32_causal", 8, 12, 512, 512, 64, torch.float32, None, True),
    ("gpt2_bf16_causal", 8, 12, 512, 512, 64, torch.bfloat16, None, True),
    ("vit_fp32_197", 16, 6, 197, 197, 64, torch.float32, None, False),
    ("vit_bf16_197", 16, 6, 197, 197, 64, torch.bfloat16, None, False),
    ("bool_mask_fp16", 4, 8, 100, 77, 64, torch.float16, "bool", False),
    ("full_mask_bf16_odd", 4, 8, 100, 77, 64, torch.bfloat16, "full", False),
]
print(torch.__version__, torch.cuda.get_device_name())
print(aten._scaled_dot_product_flash_attention.default._schema)
import sys
if len(sys.argv) > 1 and sys.argv[1] == "nocudnn":
    torch.backends.cuda.enable_cudnn_sdp(False)
    cases = [c for c in cases if c[6] != torch.float32]
    print("cuDNN attention off")
for name, B, H, L, S, E, dtype, mk, causal in cases:
    try:
        q = torch.randn(B, L, H, E, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_()
        k = torch.randn(B, S, H, E, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_()
        v = torch.randn(B, S, H, E, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_()
        mask = {None: None, "bcast": torch.randn(B, 1, 1, S, device="cuda", dtype=dtype),
                "bool": torch.rand(B, 1, L, S, device="cuda") > 0.3,
                "full": torch.randn(B, H, L, S, device="cuda", dtype=dtype)}[mk]
        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, causal, scale=None, enable_gqa=False)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        g = torch.randn_like(ref)
        rq, rk, rv = torch.autograd.grad(ref, (q, k, v), g)
        ref2 = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        r2 = torch.autograd.grad(ref2, (q, k, v), g)
        print(f"  {name}: eager twice: out eq {torch.equal(ref, ref2)} grads eq {[torch.equal(a, b) for a, b in zip((rq, rk, rv), r2)]}")
        with torch.no_grad():
            if choice == 2:
                m = prep_mask(mask, q, k, dtype)
                out, lse, seed, off = aten._scaled_dot_product_efficient_attention(q, k, v, m, True, 0.0, causal, scale=None)
                info = f"seed {tuple(seed.shape)} {seed.device} {seed.dtype}"
                for label, sd, of in (("fresh cpu", torch.empty((), dtype=torch.long), torch.empty((), dtype=torch.long)), ("returned", seed, off)):
                    try:
                        dq, dk, dv, db = aten._scaled_dot_product_efficient_attention_backward(
                            g, q, k, v, m, out, lse, sd, of, 0.0, [True, True, True, False], causal, scale=None)
                        print(f"  {name}: efficient backward with {label} seed ok; grads eq",
                              torch.equal(dq, rq), torch.equal(dk, rk), torch.equal(dv, rv), db is None or db.numel() == 0)
                    except Exception as e:
                        print(f"  {name}: efficient backward with {label} seed FAILED {type(e).__name__}: {str(e)[:200]}")
            elif choice == 1:
                res = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=None)
                out, lse = res[0], res[1]
                info = f"cum {[type(x).__name__ if not isinstance(x, torch.Tensor) else tuple(x.shape) for x in res[2:4]]} max {res[4:6]} rng {[tuple(x.shape) if isinstance(x, torch.Tensor) else x for x in res[6:8]]}"
                for label, cq, ck, s1, s2 in (("None/empty", None, None, torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long)),
                                              ("returned", res[2], res[3], res[6], res[7])):
                    try:
                        dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
                            g, q, k, v, out, lse, cq, ck, L, S, 0.0, causal, s1, s2, scale=None)
                        print(f"  {name}: flash backward with {label} ok; grads eq",
                              torch.equal(dq, rq), torch.equal(dk, rk), torch.equal(dv, rv))
                    except Exception as e:
                        print(f"  {name}: flash backward with {label} FAILED {type(e).__name__}: {str(e)[:200]}")
            elif choice == 3:
                m = mask
                if m is not None and m.dtype == torch.bool:
                    m = torch.zeros_like(m, dtype=dtype).masked_fill(~m, float("-inf"))
                res = aten._scaled_dot_product_cudnn_attention(q, k, v, m, True, 0.0, causal, False, scale=None)
                out, lse = res[0], res[1]
                info = f"cum {[type(x).__name__ if not isinstance(x, torch.Tensor) else tuple(x.shape) for x in res[2:4]]} max {res[4:6]} rng {[(tuple(x.shape), x.dtype, x.device.type) if isinstance(x, torch.Tensor) else x for x in res[6:8]]}"
                for label, cq, ck, s1, s2 in (("None/cpu", None, None, torch.empty((), dtype=torch.long), torch.empty((), dtype=torch.long)),
                                              ("returned", res[2], res[3], res[6], res[7])):
                    try:
                        dq, dk, dv = aten._scaled_dot_product_cudnn_attention_backward(
                            g, q, k, v, out, lse, s1, s2, m, cq, ck, L, S, 0.0, causal, scale=None)
                        print(f"  {name}: cudnn backward with {label} ok; grads eq",
                              torch.equal(dq, rq), torch.equal(dk, rk), torch.equal(dv, rv))
                    except Exception as e:
                        print(f"  {name}: cudnn backward with {label} FAILED {type(e).__name__}: {str(e)[:300]}")
            else:
                out, lse, info = ref, None, "other backend"
        print(f"{name}: choice {choice} out eq {torch.equal(out, ref)} out strides {out.stride()} "
              f"lse {None if lse is None else (tuple(lse.shape), lse.dtype, lse.stride())} {info}", flush=True)
    except Exception:
        print(name, "FAILED"); traceback.print_exc()
