"""GPU kernel figures (Triton path): eager vs torch.compile vs kiln, CUDA-event medians.

    python -m benchmarks.gpu_kernels [--only NAME,...] [--profile resnet18] [--calls N]

Kernel rows (aten graphs compiled by ``compile_aten_graph``): an 8-op pointwise chain,
row softmax and LayerNorm over 16384×4096 fp32, the toy example's sum over 2^26, sums
over each dim of 256×512×1024, bf16 GELU, and column sums of GPT-2's backward
(``colsum_bf16``, ``ln_wgrad``, ``bias_grad_3072``: ``--only
colsum_bf16,ln_wgrad,bias_grad_3072``). Each row prints eager / torch.compile / kiln
medians (ms), the kiln ratio, kiln's achieved GB/s and its max error against eager.

``--profile MODEL`` (resnet18, resnet50: bf16 inference, batch 16, 128 px) times
eager and ``kiln.compile`` per call with host clocks (what a user sees, launch overhead
included), then prints kiln's cProfile top functions and the number of GPU kernels and
their GPU time per call from torch.profiler: CPU-bound or GPU-bound, and where.
Needs a CUDA GPU.

Measured on one H100 80GB (torch 2.11, Triton 3.6), 2026-11-23, with
``python -m benchmarks --device cuda --suite all --backends eager,torch.compile,kiln
--only softmax,layernorm,toy_example,sum_dim,gelu_mlp,resnet18,resnet50/infer,vit_b_16/infer
--no-warm`` (median ms eager / torch.compile / kiln, kiln's speedup; before = the README
table of the same morning):

    softmax 16384x4096 fp32     0.230 / 0.181 / 0.182   1.26x   (before 0.303, 0.76x)
    layernorm 16384x4096 fp32   0.271 / 0.182 / 0.181   1.49x   (before 0.328, 0.83x)
    toy_example 2^26 fp32       1.195 / 0.605 / 0.595   2.01x   (before 58.67, 0.02x)
    sum_dim0 256x512x1024       0.184 / 0.179 / 0.181   1.02x   (before 1.761, 0.10x)
    sum_dim1                    0.187 / 0.179 / 0.178   1.05x   (before 0.919, 0.20x)
    sum_dim2                    0.182 / 0.174 / 0.174   1.05x   (before 0.174, 1.05x)
    gelu_mlp bf16               3.194 / 3.270 / 3.279   0.97x   (before: CompilationError)
    resnet18 infer bf16         1.986 / 1.058 / 0.458   4.33x   (before 5.168, 0.56x)
    resnet50 infer bf16         3.972 / 2.086 / 1.148   3.46x   (before 12.19, 0.48x)
    resnet50 infer fp32         6.992 / 7.394 / 5.930   1.18x   (before 11.27, 0.62x)
    vit_b_16 infer bf16         2.861 / 2.354 / 1.650   1.73x   (before: CompilationError)
    resnet18 train fp32 cold compile: kiln 9.1 s (before 26.6 s), torch.compile 14.8 s

(Model rows are host-bound: eager's own figure moves by ±30% between runs.)
"""
import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import torch
import torch.fx as fx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from kiln.kernels import compile_aten_graph  # noqa: E402

aten = torch.ops.aten


def chain8(x, y):
    a = aten.mul.Tensor(x, y); a = aten.add.Tensor(a, 1.5); a = aten.sigmoid.default(a)
    a = aten.mul.Tensor(a, x); a = aten.exp.default(a); a = aten.sub.Tensor(a, y)
    a = aten.relu.default(a); a = aten.div.Tensor(a, 3.0)
    return (a,)


def softmax(x):
    return (aten._softmax.default(x, -1, False),)


def layernorm(x, w, b):
    return (aten.native_layer_norm.default(x, [4096], w, b, 1e-5)[0],)


def toy(a, b):
    x = aten.div.Tensor(a, aten.add.Tensor(aten.abs.default(a), 1))
    return (x, aten.lt.Scalar(aten.sum.default(b), 0))


def fullsum(b):
    return (aten.sum.default(b),)


def sum_dim(d):
    def f(x):
        return (aten.sum.dim_IntList(x, [d]),)
    f.__name__ = f"sum_dim{d}"
    return f


def gelu(x):
    return (aten.gelu.default(x),)


def colsum_f32(x):
    """A bf16 [rows, cols] summed over rows in float32 (autocast's ``x.float().sum(0)``)."""
    return (aten.sum.dim_IntList(aten._to_copy.default(x, dtype=torch.float32), [0]),)


def ln_wgrad(a, b):
    """LayerNorm's weight and bias gradients over (batch, sequence): two column sums
    in one kernel (GPT-2's backward has ~24 of these)."""
    return (aten.sum.dim_IntList(aten.mul.Tensor(a, b), [0, 1]),
            aten.sum.dim_IntList(a, [0, 1]))


def bias_grad(x):
    """A Linear's bias gradient: a bf16 [tokens, features] summed over tokens to fp32."""
    return (aten.sum.dim_IntList(x, [0], dtype=torch.float32),)


def mm_t_operand(x, g):
    """GPT-2's MLP weight gradient: the fp32 GELU cast to bf16, read transposed by the
    product (kiln stores the cast in its read order and passes the transposed view)."""
    h = aten._to_copy.default(aten.gelu.default(x, approximate="tanh"), dtype=torch.bfloat16)
    return (aten.mm.default(aten.permute.default(h, [1, 0]), g),)


def ce_grad_padded(lsm, tgt, w):
    """GPT-2's LM-head backward (vocabulary 50257, bf16 autocast): cross-entropy's fp32
    logits gradient, reshaped to [B, S, V], cast to bf16 and multiplied by the tied
    weight; pad_mm pads V to 50264, and kiln writes the padded bf16 operand in one
    kernel (no fp32 gradient stored first)."""
    onehot = aten.scatter.value(aten.zeros_like.default(lsm), 1, aten.unsqueeze.default(tgt, 1), -1.0)
    g = aten.mul.Tensor(onehot, 1.0 / 4096)
    s = aten.sum.dim_IntList(g, [1], True)
    g = aten.sub.Tensor(g, aten.mul.Tensor(aten.exp.default(lsm), s))
    g = aten._to_copy.default(aten.view.default(g, [8, 512, 50257]), dtype=torch.bfloat16)
    return (aten.mm.default(aten.view.default(g, [4096, 50257]), w),)


def gelu_fp32_flat_bf16(x):
    """GPT-2's MLP activation under bf16 autocast: the tanh GELU of the bf16 product in
    fp32 (autocast's ``pow``), flattened to [tokens, 3072] and cast to bf16 for the next
    product (a merge of dims and a flat index divided by sizes)."""
    h = aten.gelu.default(aten._to_copy.default(x, dtype=torch.float32), approximate="tanh")
    return (aten._to_copy.default(aten.view.default(h, [4096, 3072]), dtype=torch.bfloat16),)


def permute_copy(x):
    """A transpose made contiguous: the flat index divided by both inner sizes."""
    return (aten.clone.default(aten.permute.default(x, [0, 2, 1]),
                               memory_format=torch.contiguous_format),)


def rows():
    r = torch.randn
    big = (256, 512, 1024)
    return [
        ("chain8", chain8, lambda: [r(4096, 4096, device="cuda"), r(4096, 4096, device="cuda")]),
        ("softmax", softmax, lambda: [r(16384, 4096, device="cuda")]),
        ("layernorm", layernorm, lambda: [r(16384, 4096, device="cuda"), r(4096, device="cuda"),
                                          r(4096, device="cuda")]),
        ("toy", toy, lambda: [r(1 << 26, device="cuda"), r(1 << 26, device="cuda")]),
        ("fullsum", fullsum, lambda: [r(1 << 26, device="cuda")]),
        ("sum_dim0", sum_dim(0), lambda: [r(*big, device="cuda")]),
        ("sum_dim1", sum_dim(1), lambda: [r(*big, device="cuda")]),
        ("sum_dim2", sum_dim(2), lambda: [r(*big, device="cuda")]),
        ("gelu_bf16", gelu, lambda: [r(8192, 16384, device="cuda", dtype=torch.bfloat16)]),
        ("softmax_bf16", softmax, lambda: [r(16384, 4096, device="cuda", dtype=torch.bfloat16)]),
        ("softmax_long", softmax, lambda: [r(256, 65536, device="cuda")]),
        # column reductions (the kept dim contiguous): GPT-2 small's backward, batch 8x512
        ("colsum_bf16", colsum_f32, lambda: [r(4096, 768, device="cuda", dtype=torch.bfloat16)]),
        ("ln_wgrad", ln_wgrad, lambda: [r(8, 512, 768, device="cuda"), r(8, 512, 768, device="cuda")]),
        ("bias_grad_3072", bias_grad,
         lambda: [r(4096, 3072, device="cuda", dtype=torch.bfloat16)]),
        ("mm_t_operand", mm_t_operand, lambda: [r(4096, 3072, device="cuda"),
                                                r(4096, 768, device="cuda", dtype=torch.bfloat16)]),
        ("gelu_flat_bf16", gelu_fp32_flat_bf16,
         lambda: [r(8, 512, 3072, device="cuda", dtype=torch.bfloat16)]),
        ("permute_copy", permute_copy, lambda: [r(64, 1000, 500, device="cuda")]),
        ("ce_grad_padded", ce_grad_padded, lambda: [
            torch.log_softmax(r(4096, 50257, device="cuda"), 1),
            torch.randint(0, 50257, (4096,), device="cuda"),
            r(50257, 768, device="cuda", dtype=torch.bfloat16)]),
    ]


def bench(fn, args, n=50):
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(*args); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[n // 2]


def kernel_rows(only, with_tc=True):
    print(f"{'row':14s} {'eager':>8s} {'t.compile':>9s} {'kiln':>8s} {'ratio':>6s} {'GB/s':>7s}  err")
    for name, f, make in rows():
        if only and name not in only:
            continue
        args = make()
        gm = fx.symbolic_trace(f)
        try:
            t0 = time.perf_counter()
            c = compile_aten_graph(gm, args)
            c(*args)
            torch.cuda.synchronize()
            cold = time.perf_counter() - t0
            got, ref = c(*args), gm(*args)
            err = max(((g.double() - e.double()).abs().max() / e.double().abs().max().clamp_min(1e-30)).item()
                      for g, e in zip(got, ref) if e.is_floating_point())
            tk = bench(c, args)
        except Exception as e:   # noqa: BLE001
            print(f"{name:14s} kiln failed: {type(e).__name__}: {str(e)[:300]}")
            continue
        te = bench(gm, args)
        try:
            tc = bench(torch.compile(gm), args) if with_tc else float("nan")
        except Exception:        # noqa: BLE001
            tc = float("nan")
        nbytes = sum(a.numel() * a.element_size() for a in args) + sum(
            o.numel() * o.element_size() for o in got)
        print(f"{name:14s} {te:8.3f} {tc:9.3f} {tk:8.3f} {te / tk:5.2f}x {nbytes / tk / 1e6:7.0f}  "
              f"{err:.1e}  (cold {cold:.2f}s)", flush=True)


def profile_model(name, calls, with_tc=True):
    import torchvision

    import kiln
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)().eval().to(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(16, 3, 128, 128, device="cuda", dtype=torch.bfloat16)
    compiled = kiln.compile(model, backend="kiln")

    def wall(fn):
        with torch.no_grad():
            for _ in range(5):
                fn(x)
            torch.cuda.synchronize()
            ts = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn(x)
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
        ts.sort()
        return ts[len(ts) // 2] * 1e3
    t0 = time.perf_counter()
    with torch.no_grad():
        compiled(x)
    torch.cuda.synchronize()
    print(f"{name}: kiln first call {time.perf_counter() - t0:.2f} s")
    print(kiln.compile_times() if hasattr(kiln, "compile_times") else "")
    with torch.no_grad():
        err = (compiled(x).float() - model(x).float()).abs().max() / model(x).float().abs().max()
    te, tk = wall(model), wall(compiled)
    tc = wall(torch.compile(model)) if with_tc else float("nan")
    torch.cuda.reset_peak_memory_stats()
    wall(model)
    pe = torch.cuda.max_memory_allocated() / 2**20
    torch.cuda.reset_peak_memory_stats()
    wall(compiled)
    pk = torch.cuda.max_memory_allocated() / 2**20
    print(f"{name} bf16 b16 128px per call (host clock): eager {te:.3f} ms, torch.compile {tc:.3f} ms, "
          f"kiln {tk:.3f} ms ({te / tk:.2f}x), rel err {err.item():.1e}; peak MB eager {pe:.0f} kiln {pk:.0f}")
    # host time of one kiln call without waiting on the GPU
    with torch.no_grad():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            compiled(x)
        host = (time.perf_counter() - t0) / calls * 1e3
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            model(x)
        host_e = (time.perf_counter() - t0) / calls * 1e3
        torch.cuda.synchronize()
    print(f"host-side ms per call (no sync): kiln {host:.3f}, eager {host_e:.3f}")
    from kiln.kernels.codegen.triton import launcher
    print("direct-launch misses:", dict(launcher.Launcher.why))
    import gc
    from kiln.kernels.runtime import graph_replay
    for o in gc.get_objects():
        if isinstance(o, graph_replay.GraphReplay):
            print(f"cuda graph: calls {o.calls}, recorded {o.graph is not None}, "
                  f"moving inputs {sorted(o.moving)}, disabled {o.disabled} ({o.reason})")
    pr = cProfile.Profile()
    with torch.no_grad():
        pr.enable()
        for _ in range(20):
            compiled(x)
        torch.cuda.synchronize()
        pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    print("\n".join(s.getvalue().splitlines()[:60]))
    from torch.profiler import ProfilerActivity, profile
    for label, fn in (("eager", model), ("kiln", compiled)):
        with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn(x)
            torch.cuda.synchronize()
        evs = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        n = sum(e.count for e in evs) / 10
        gpu = sum(e.self_device_time_total for e in evs) / 10 / 1e3
        print(f"{label}: {n:.0f} GPU kernels per call, {gpu:.3f} ms GPU time per call")
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=12)[:3500])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--only", default="")
    p.add_argument("--profile", default="")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--no-tc", action="store_true", help="skip torch.compile")
    a = p.parse_args()
    if a.profile:
        for m in a.profile.split(","):
            profile_model(m, a.calls, not a.no_tc)
    else:
        kernel_rows([s for s in a.only.split(",") if s], not a.no_tc)


if __name__ == "__main__":
    main()
