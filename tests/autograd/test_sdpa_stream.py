"""Attention in a graph compiled per size of a stream prefers kernels that plan
nothing per shape (``sdpa.in_stream``): its calls run marked, other graphs' do not,
and on a GPU the mark makes PyTorch choose the flash kernel over cuDNN's."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.autograd import sdpa


def _attend(x, w):
    q = (x @ w).unflatten(-1, (2, 8)).transpose(1, 2)
    return F.scaled_dot_product_attention(q, q, q, is_causal=True).sum()


def test_a_size_streams_attention_runs_marked(monkeypatch):
    marks, real = [], sdpa._call

    def spy(*a):
        marks.append(getattr(sdpa._stream, "on", False))
        return real(*a)
    monkeypatch.setattr(sdpa, "_call", spy)
    monkeypatch.setattr(kiln.config, "perf_fallback", False)
    cf = kiln.compile(_attend)
    w = torch.randn(16, 16)
    for n in (9, 10, 11, 12):
        x = torch.randn(2, n, 16)
        torch.testing.assert_close(cf(x, w), _attend(x, w), atol=1e-4, rtol=1e-4)
    assert marks and marks[0] is False, "the first, static graph's attention: unmarked"
    assert marks[-1] is True and marks.count(True) >= 3, "the stream's graph's: marked"
    assert getattr(sdpa._stream, "on", False) is False, "the mark is the call's only"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_mark_picks_flash_over_cudnn_on_the_gpu():
    q = torch.randn(4, 8, 137, 64, device="cuda", dtype=torch.bfloat16)
    with sdpa._stream_order():
        choice = int(torch._fused_sdp_choice(q, q, q, None, 0.0, True))
    assert choice == sdpa.FLASH, choice
    before = sdpa.in_stream(True)
    try:
        out = sdpa._call(q, q, q, None, 0.0, True, None, False)
    finally:
        sdpa.in_stream(before)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, q, q, is_causal=True),
                               atol=2e-2, rtol=2e-2)
