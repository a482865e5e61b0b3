"""Why do cuDNN's key gradients differ from eager's when kiln calls it with a mask?
Logs the mask layouts kiln's fused attention ops see, and compares dk from direct calls
with those layouts."""
import torch
import torch.nn.functional as F
import kiln
from kiln.autograd import sdpa

aten = torch.ops.aten
seen = []
orig = sdpa._kernel_mask


def logged(mask, q, k, kernel):
    m = orig(mask, q, k, kernel)
    seen.append((None if mask is None else (tuple(mask.shape), mask.stride(), mask.dtype),
                 None if m is None else (tuple(m.shape), m.stride())))
    return m


sdpa._kernel_mask = logged
torch.manual_seed(0)
for dtype, kind in ((torch.bfloat16, "broadcast"), (torch.float16, "bool")):
    b, h, e, length = 2, 4, 64, 128
    q, k, v = (torch.randn(b, length, h, e, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_()
               for _ in range(3))
    mask = (torch.randn(b, 1, 1, length, device="cuda", dtype=dtype) if kind == "broadcast"
            else torch.rand(b, 1, length, length, device="cuda") > 0.2)

    def f(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2
    ref = f(q, k, v, mask)
    g = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (q, k, v), g)
    seen.clear()
    out = kiln.compile(f, backend="aot_eager", fullgraph=True)(q, k, v, mask)
    got = torch.autograd.grad(out, (q, k, v), g)
    print(kind, "masks seen (given -> passed):", seen)
    print(kind, "grads equal:", [torch.equal(a, b_) for a, b_ in zip(got, want)],
          "max diff", [(a.float() - b_.float()).abs().max().item() for a, b_ in zip(got, want)])
    # direct calls with the forward's mask in several layouts
    with torch.no_grad():
        m0 = mask if mask.dtype != torch.bool else torch.zeros_like(mask, dtype=dtype).masked_fill_(~mask, float("-inf"))
        res = aten._scaled_dot_product_cudnn_attention(q, k, v, m0, True, 0.0, False, False, scale=None)
        o, lse = res[0], res[1]
        rng = torch.empty((), dtype=torch.long, device="cuda")
        for label, m in (("as forward", m0), ("expanded", m0.expand(b, h, length, length)),
                         ("dense copy", m0.expand(b, h, length, length).contiguous()),
                         ("kiln's backward", logged(mask, q, k, sdpa.CUDNN))):
            d = aten._scaled_dot_product_cudnn_attention_backward(
                g * 2, q, k, v, o, lse, res[6], res[7], m, None, None, length, length, 0.0, False, scale=None)
            print(f"  direct backward, mask {label} {tuple(m.shape)} {m.stride()}: grads equal eager",
                  [torch.equal(a, b_) for a, b_ in zip(d, want)])
        d2 = aten._scaled_dot_product_cudnn_attention_backward(
            (g * 2).contiguous(), q, k, v, o, lse, res[6], res[7], m0, None, None, length, length, 0.0, False, scale=None)
        print("  grad contiguous:", [torch.equal(a, b_) for a, b_ in zip(d2, want)], (g * 2).stride())
