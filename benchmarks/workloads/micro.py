"""Micro workloads: single fused-kernel-sized programs where the ceiling is known.

Sizes per device: on a GPU the brief's (sin+cos over 2^28 fp32, softmax/LayerNorm on
16384×4096, the bf16 8192×4096→16384→4096 MLP); on a CPU sizes that run in
milliseconds; ``quick`` shrinks the CPU sizes further.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.workloads import Instance, Workload

N_INPUT_SETS = 3


def pointwise8(x):
    """Eight pointwise ops in a row: one kernel when fused, eight round trips eagerly."""
    y = x * 1.5
    y = y + 0.25
    y = torch.sigmoid(y)
    y = y * x
    y = y - 0.125
    y = torch.tanh(y)
    y = y * 0.5
    return y + x


def softmax(x):
    return torch.softmax(x, dim=-1)


def sin_cos(x):
    return torch.sin(x) + torch.cos(x)


def toy_example(a, b):
    """The FAQ's example: a data-dependent branch splits it into two graphs."""
    x = a / (torch.abs(a) + 1)
    if b.sum() < 0:
        b = b * -1
    return x * b


def _sum_dim(d):
    def f(x):
        return x.sum(dim=d)

    f.__name__ = f.__qualname__ = f"sum_dim{d}"
    return f


class GeluMLP(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def _randn_sets(shapes, dtype, device, seed=0):
    """Seeded normal inputs made on the device itself (building 2^28-element tensors on
    the host and copying them over would cost seconds per cell)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return [tuple(torch.randn(s, generator=g, device=device, dtype=torch.float32).to(dtype)
                  for s in shapes)
            for _ in range(N_INPUT_SETS)]


def _fn_workload(name, fn, shapes, out_numel, dtype, tol):
    el = torch.tensor([], dtype=dtype).element_size()
    n_in = sum(_numel(s) for s in shapes)

    def build(device):
        return Instance(fn=fn, inputs=_randn_sets(shapes, dtype, device))

    return Workload(name, "micro", "infer", dtype, build, tol=tol,
                    bytes_moved=(n_in + out_numel) * el)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


#: sizes per device profile: vector length, (rows, cols), 3-d reduction shape, MLP (B, d, h)
SIZES = {
    "cuda": dict(vec=1 << 26, sincos=1 << 28, toy=1 << 26, rows=(16384, 4096),
                 red=(256, 512, 1024), mlp=(8192, 4096, 16384), mlp_dtype=torch.bfloat16),
    "cpu": dict(vec=1 << 22, sincos=1 << 22, toy=1 << 22, rows=(2048, 1024),
                red=(64, 256, 256), mlp=(256, 512, 2048), mlp_dtype=torch.float32),
    "cpu-quick": dict(vec=1 << 20, sincos=1 << 20, toy=1 << 20, rows=(512, 1024),
                      red=(32, 128, 256), mlp=(128, 256, 1024), mlp_dtype=torch.float32),
}


def workloads(device: str, quick: bool) -> list[Workload]:
    s = SIZES["cuda" if device == "cuda" else ("cpu-quick" if quick else "cpu")]
    f32 = torch.float32
    out = [
        _fn_workload("pointwise8", pointwise8, [(s["vec"],)], s["vec"], f32, 1e-5),
        _fn_workload("sin_cos", sin_cos, [(s["sincos"],)], s["sincos"], f32, 1e-5),
        _fn_workload("softmax", softmax, [s["rows"]], _numel(s["rows"]), f32, 1e-5),
        _layernorm(s["rows"], device),
        _fn_workload("toy_example", toy_example, [(s["toy"],), (s["toy"],)], s["toy"], f32, 1e-5),
    ]
    red = s["red"]
    for d in range(3):
        out_numel = _numel(red) // red[d]
        out.append(_fn_workload(f"sum_dim{d}", _sum_dim(d), [red], out_numel, f32, 1e-5))
    out.append(_mlp(*s["mlp"], s["mlp_dtype"]))
    return out


def _layernorm(rows, device):
    n, d = rows

    def build(device):
        torch.manual_seed(0)
        with torch.device(device):
            ln = nn.LayerNorm(d)
        with torch.no_grad():  # non-trivial affine parameters, so they are really used
            ln.weight.normal_()
            ln.bias.normal_()
        return Instance(fn=ln, inputs=_randn_sets([rows], torch.float32, device))

    return Workload("layernorm", "micro", "infer", torch.float32, build, tol=1e-5,
                    bytes_moved=2 * n * d * 4)


def _mlp(b, d, h, dtype):
    def build(device):
        torch.manual_seed(0)
        with torch.device(device):
            m = GeluMLP(d, h).to(dtype=dtype)
        return Instance(fn=m, inputs=_randn_sets([(b, d)], dtype, device))

    tol = 1e-4 if dtype == torch.float32 else 2e-2
    return Workload("gelu_mlp", "micro", "infer", dtype, build, tol=tol,
                    flops=2 * b * d * h * 2)
