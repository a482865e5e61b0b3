"""kiln's main demonstration: the tutorial's examples compiled, with what happened.

Run from the repository root: ``.venv/bin/python -m examples.demo``.
"""
import copy
import time

import torch

import kiln


def banner(title):
    print("\n" + "=" * 78 + f"\n{title}\n" + "=" * 78)


def same(a, b):
    return "equal to eager" if torch.allclose(a, b, rtol=1e-5, atol=1e-5) else "DIFFERENT FROM EAGER"


def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    print("  (toy_example prints: woo)")
    if b.sum() < 0:
        b = b * -1
    return x * b


def foo(x, y):
    a = torch.sin(x)
    b = torch.cos(x)
    return a + b


def main():
    torch.manual_seed(0)
    banner("1. foo: one graph, shown by a custom backend")

    def show(gm, example_inputs):
        print(gm.print_readable(print_output=False))
        return gm.forward

    x, y = torch.randn(10, 10), torch.randn(10, 10)
    print("result:", same(kiln.optimize(show)(foo)(x, y), foo(x, y)))

    banner("2. toy_example (the FAQ's): graph breaks at print() and at a data-dependent if")
    ex = kiln.explain(toy_example)(torch.randn(10), torch.randn(10))
    print(ex)
    opt = kiln.compile(toy_example, backend="eager")
    for sign in (1, -1):
        a, b = torch.randn(10), sign * torch.randn(10).abs()
        print(f"  b.sum() {'>=' if sign > 0 else '<'} 0:", same(opt(a, b), toy_example(a, b)))

    banner("3. fullgraph=True names the user's line at the first break")
    try:
        kiln.compile(toy_example, backend="eager", fullgraph=True)(torch.randn(10), torch.randn(10))
    except kiln.Unsupported as e:
        print("kiln.Unsupported:", e)

    banner("4. The three backends on a training step of toy_example")
    for backend in ("eager", "aot_eager", "kiln"):
        a = torch.randn(64, requires_grad=True)
        b = torch.randn(64)
        f = kiln.compile(toy_example, backend=backend)
        out = f(a, b)
        out.sum().backward()
        g = a.grad.clone()
        a.grad = None
        toy_example(a, b).sum().backward()
        print(f"  {backend:10s} output {same(out, toy_example(a, b))}, gradient {same(g, a.grad)}")

    banner("5. torchvision resnet18, fullgraph=True, inference through each backend")
    try:
        from torchvision.models import resnet18
    except ImportError:
        print("torchvision is not installed")
        return
    m = resnet18()
    ref = copy.deepcopy(m)
    xb = torch.randn(4, 3, 64, 64)
    for backend in ("eager", "aot_eager", "kiln"):
        kiln.reset()
        m.load_state_dict(ref.state_dict())
        c = kiln.compile(m, backend=backend, fullgraph=True)
        m.eval(); ref.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = c(xb)
        t1 = time.perf_counter()
        with torch.no_grad():
            r = ref(xb)
        print(f"  {backend:10s} eval: first call {t1 - t0:5.2f}s (compile + run), {same(out, r)}")
    ex = kiln.explain(m)(xb)
    print(f"  resnet18: {ex.graph_count} graph, {ex.graph_break_count} breaks, {ex.op_count} ops")
    print("\nCompile time by stage:\n" + kiln.compile_times())


if __name__ == "__main__":
    main()
