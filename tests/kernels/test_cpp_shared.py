"""Repeated blocks' C++ kernels are one function each (kernels/codegen/cpp/shared.py):
a model of 6 identical blocks compiles as many kernel functions as one of 3 (the first
and last blocks' backwards differ from the middle ones'), its results
and gradients are eager's, and a block that differs keeps kernels of its own."""
import pytest
import torch
import torch.nn as nn

import kiln
from kiln import config
from kiln.kernels.codegen.cpp import shared
from kiln.kernels.codegen.cpp import source as cpp_source


class Block(nn.Module):
    def __init__(self, h, inner):
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.fc = nn.Linear(h, inner)
        self.proj = nn.Linear(inner, h)

    def forward(self, x):
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.ln(x))))


class Stack(nn.Module):
    def __init__(self, inners, h=32):
        super().__init__()
        self.blocks = nn.ModuleList(Block(h, i) for i in inners)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.softmax(-1)


def _sources(monkeypatch):
    """The C++ translation units generated from now on (one per compiled graph)."""
    made = []

    def generate(*a, **k):
        r = real(*a, **k)
        made.append(r[0])
        return r

    real = cpp_source.generate
    monkeypatch.setattr(cpp_source, "generate", generate)
    return made


def _functions(src: str) -> int:
    return src.count("\nstatic void kernel")


def _run(model, monkeypatch, train=True, regional=True, fn=None):
    """Compile ``model`` (fresh: no graph cache), check values and gradients against
    eager; the number of kernel functions of each generated source."""
    torch.manual_seed(0)
    x = torch.randn(4, 8, 32, requires_grad=train)
    fn = fn or model
    ref = fn(x)
    if train:
        ref.square().sum().backward()
        ref_grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
        model.zero_grad(set_to_none=True)
        x.grad = None
    made = _sources(monkeypatch)
    with config.patch(regional=regional, graph_cache=False):
        compiled = kiln.compile(fn)
        if train:
            out = compiled(x)
            out.square().sum().backward()
            grads = [p.grad for p in model.parameters()] + [x.grad]
            for g, r in zip(grads, ref_grads):
                torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
        else:
            with torch.no_grad():
                out = compiled(x)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-4, atol=1e-5)
    assert made, "no C++ source was generated"
    return [_functions(s) for s in made]


@pytest.mark.slow   # (the quick subset's time: run in full CI)
def test_identical_blocks_compile_one_blocks_kernels(monkeypatch):
    torch.manual_seed(0)
    three = _run(Stack([64] * 3), monkeypatch)
    six = _run(Stack([64] * 6), monkeypatch)
    assert six == three, (three, six)             # forward and backward: no more functions
    unshared = _run(Stack([64] * 6), monkeypatch, regional=False)
    assert all(u > s for u, s in zip(unshared, six)), (unshared, six)


def test_inference_blocks_shared(monkeypatch):
    torch.manual_seed(0)
    with torch.no_grad():
        two = _run(Stack([64] * 2), monkeypatch, train=False)
        six = _run(Stack([64] * 6), monkeypatch, train=False)
    assert six == two


def test_a_block_that_differs_is_not_shared(monkeypatch):
    torch.manual_seed(0)
    same = _run(Stack([64] * 6), monkeypatch)
    torch.manual_seed(0)
    odd = _run(Stack([64] * 5 + [48]), monkeypatch)   # the last block's MLP is narrower
    assert all(o > s for o, s in zip(odd, same)), (odd, same)


def test_a_hooked_block_keeps_its_own_kernels(monkeypatch):
    torch.manual_seed(0)
    m = Stack([64] * 6)
    m.blocks[3].register_forward_hook(lambda mod, args, out: out * 2 + 1)
    _run(m, monkeypatch)


def _kernel(gi, params, body, types):
    sig = ", ".join(f"{types[p]}* __restrict__ {p}" for p in params)
    return (f"// kernel {gi}: from x\nstatic void kernel{gi}({sig}) {{\n{body}\n}}", params)


def test_parameters_are_matched_by_use_not_by_name_order():
    # "buf10" sorts before "buf9": the two kernels list their parameters in another order
    t = {"buf9": "const float", "buf10": "const float", "buf11": "float",
         "buf29": "const float", "buf30": "const float", "buf31": "float"}
    a = _kernel(1, ["buf10", "buf9", "buf11"],
                "  float acc_buf11 = buf9[0] - buf10[0];\n  buf11[0] = acc_buf11;", t)
    b = _kernel(2, ["buf29", "buf30", "buf31"],
                "  float acc_buf31 = buf29[0] - buf30[0];\n  buf31[0] = acc_buf31;", t)
    calls = shared.share([(1, a[0], a[1], ["buf11"]), (2, b[0], b[1], ["buf31"])])
    # kernel1(buf10, buf9, buf11) computes buf9 - buf10: kernel 2's call passes buf30, buf29
    assert calls == {2: shared.Shared(1, ("buf30", "buf29", "buf31"))}


def test_kernels_that_differ_are_not_shared():
    t = {"buf1": "const float", "buf2": "float", "buf3": "const double", "buf4": "double",
         "buf5": "const float", "buf6": "float"}
    a = _kernel(1, ["buf1", "buf2"], "  buf2[0] = buf1[0] + 1;", t)
    b = _kernel(2, ["buf3", "buf4"], "  buf4[0] = buf3[0] + 1;", t)      # another dtype
    c = _kernel(3, ["buf5", "buf6"], "  buf6[0] = buf5[0] + 2;", t)      # another constant
    d = _kernel(4, ["buf5", "buf6"], "  buf6[0] = buf5[0] + 1 + buf6[0];", t)
    made = [(gi, s, p, []) for gi, (s, p) in zip((1, 2, 3, 4), (a, b, c, d))]
    assert shared.share(made) == {}


@pytest.mark.slow
def test_gpt2_layers_share_kernels(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()

    def model(n):
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=n,
                                      n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, use_cache=False)
        return transformers.GPT2LMHeadModel(cfg)

    counts = []
    for n in (3, 5):
        m = model(n)
        ids = torch.randint(0, 100, (2, 16))
        ref = m(input_ids=ids).logits
        ref.square().sum().backward()
        ref_grads = [p.grad.clone() for p in m.parameters()]
        m.zero_grad(set_to_none=True)
        made = _sources(monkeypatch)
        with config.patch(graph_cache=False):
            out = kiln.compile(lambda i: m(input_ids=i).logits)(ids)
            out.square().sum().backward()
        torch.testing.assert_close(out, ref.detach(), rtol=1e-4, atol=1e-5)
        for p, g in zip(m.parameters(), ref_grads):
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5)
        counts.append([_functions(s) for s in made])
    assert counts[0] == counts[1], counts


def test_entry_points_alone_are_compiled_without_optimisation(monkeypatch):
    # the -O0 region holds every entry point and no kernel; results are eager's (_run)
    torch.manual_seed(0)
    src = _sources(monkeypatch)
    _run(Stack([64] * 3), monkeypatch)
    for s in src:
        begin, end = s.index('#pragma GCC optimize ("O0")'), s.index("#pragma GCC pop_options")
        plain = s[begin:end]
        assert 'extern "C" void kiln_seg' in plain and "static void kernel" not in plain
        assert 'extern "C" void kiln_seg' not in s[:begin] + s[end:]
    # KILN_REGIONAL=0 keeps them optimised
    off = _sources(monkeypatch)
    _run(Stack([64] * 3), monkeypatch, regional=False)
    assert off and all("#pragma GCC optimize" not in s for s in off)
