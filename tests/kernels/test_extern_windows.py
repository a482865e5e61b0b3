"""A matrix product's operand that is only a window on a stored tensor (a transpose, a
slice, a dtype round trip folded away) is handed to the library call as that window,
not copied into a new buffer first; casting up and back down folds to the value."""
import logging

import torch

import kiln


def _buffers(caplog, fn, *args):
    kiln.reset()
    f = kiln.compile(fn, backend="kiln", fullgraph=True)
    with caplog.at_level(logging.INFO, logger="kiln.output_code"):
        out = f(*args)
    lines = [s for s in caplog.text.splitlines() if s.startswith("buf")]
    return out, lines


def _round_trip_t(x, w):
    return x.to(torch.float64).to(torch.float32).t()[1:] @ w


def test_transposed_slice_of_an_input_is_read_in_place(caplog):
    x, w = torch.randn(65, 48), torch.randn(65, 40)
    out, bufs = _buffers(caplog, _round_trip_t, x, w)
    torch.testing.assert_close(out, _round_trip_t(x, w))
    assert out.stride() == _round_trip_t(x, w).stride()
    assert len(bufs) == 1 and "extern aten.mm" in bufs[0], bufs


def _round_trip_pointwise(x):
    return x.to(torch.float64).to(torch.float32) * 2 + 1


def test_exact_round_trip_casts_fold(caplog):
    x = torch.randn(16, 8)
    out, bufs = _buffers(caplog, _round_trip_pointwise, x)
    torch.testing.assert_close(out, _round_trip_pointwise(x), rtol=0, atol=0)
    assert bufs and not any("cast(" in b for b in bufs), bufs


def _lossy_round_trip(x):
    return x.to(torch.float16).to(torch.float32) * 3


def test_lossy_round_trip_keeps_its_rounding(caplog):
    x = torch.randn(64) * 1000 + 0.1234567
    out, bufs = _buffers(caplog, _lossy_round_trip, x)
    torch.testing.assert_close(out, _lossy_round_trip(x), rtol=0, atol=0)
    assert (out != x * 3).any()
