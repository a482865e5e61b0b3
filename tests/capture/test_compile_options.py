"""kiln.compile(mode=..., options=...): each accepted value sets kiln.config for the
compiled function's compiles and calls; anything else is rejected."""
import pytest
import torch

import kiln
from kiln import config
from kiln.capture.compile_options import MODES


def _f(x):
    return torch.sin(x) * 2


def _seeing(*names):
    seen = []

    def backend(gm, example_inputs):
        seen.append({n: getattr(config, n) for n in names})
        return gm.forward

    return backend, seen


@pytest.mark.parametrize("mode,cudagraphs,tuned", [
    ("default", None, False), (None, None, False), ("reduce-overhead", "1", False),
    ("max-autotune", "1", True), ("max-autotune-no-cudagraphs", "0", True)])
def test_modes_set_config_during_compile(mode, cudagraphs, tuned):
    before = (config.cudagraphs, config.autotune_min_numel)
    backend, seen = _seeing("cudagraphs", "autotune_min_numel")
    x = torch.randn(4)
    out = kiln.compile(_f, backend=backend, mode=mode)(x)
    torch.testing.assert_close(out, _f(x))
    assert seen[0]["cudagraphs"] == (cudagraphs or before[0])
    assert (seen[0]["autotune_min_numel"] == 0) == tuned
    assert (config.cudagraphs, config.autotune_min_numel) == before   # only during its calls


def test_bad_mode_lists_valid_modes():
    with pytest.raises(ValueError) as e:
        kiln.compile(_f, mode="bogus-mode")
    for m in MODES:
        assert repr(m) in str(e.value)
    with pytest.raises(ValueError):
        kiln.compile(mode="bogus-mode")      # decorator form: rejected at once


def test_mode_and_options_together():
    with pytest.raises(RuntimeError, match="mode or options"):
        kiln.compile(_f, mode="reduce-overhead", options={"fallback_random": True})


def test_options():
    assert {"triton.cudagraphs", "fallback_random", "max_autotune"} <= set(kiln.list_options())
    backend, seen = _seeing("cudagraphs", "fallback_random")
    x = torch.randn(4)
    kiln.compile(_f, backend=backend, options={"triton.cudagraphs": False,
                                               "fallback_random": True})(x)
    assert seen == [{"cudagraphs": "0", "fallback_random": True}]
    assert config.fallback_random is False


def test_unknown_option_names_close_matches():
    with pytest.raises(ValueError, match="'fallback_random'"):
        kiln.compile(_f, options={"fallback_randomm": True})
    with pytest.raises(ValueError, match="list_options"):
        kiln.compile(_f, options={"epilogue_fusion": True})
    with pytest.raises(TypeError):
        kiln.compile(_f, options={"fallback_random": "yes"})
    with pytest.raises(ValueError):
        kiln.compile(_f, options={"kernel_target": "fortran"})


def test_options_reach_the_backward_compile(monkeypatch):
    """The backward graph compiles inside loss.backward(), after the compiled call."""
    from kiln.kernels import backend as kb
    seen = []
    real = kb.compile_aten_graph

    def recording(gm, example_inputs, *a, **k):
        seen.append(config.fallback_random)
        return real(gm, example_inputs, *a, **k)

    monkeypatch.setattr(kb, "compile_aten_graph", recording)
    w = torch.randn(4, requires_grad=True)

    def loss(x):
        return (torch.tanh(x * w) * 3).sum()

    x = torch.randn(4)
    out = kiln.compile(loss, backend="kiln", options={"fallback_random": True})(x)
    out.backward()
    ref_w = w.detach().clone().requires_grad_(True)
    (torch.tanh(x * ref_w) * 3).sum().backward()
    torch.testing.assert_close(w.grad, ref_w.grad)
    assert len(seen) == 2 and all(seen), seen
    assert config.fallback_random is False


def test_module_with_mode():
    m = torch.nn.Linear(3, 2)
    backend, seen = _seeing("cudagraphs")
    x = torch.randn(5, 3)
    torch.testing.assert_close(kiln.compile(m, backend=backend, mode="reduce-overhead")(x), m(x))
    assert seen == [{"cudagraphs": "1"}]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode,replayed", [("default", False), ("reduce-overhead", True),
                                           ("max-autotune-no-cudagraphs", False)])
def test_modes_on_the_gpu(mode, replayed):
    """A one-kernel graph: replayed from a CUDA graph only under reduce-overhead (by
    default only graphs of 8 steps or more are)."""
    import gc

    from kiln.kernels.runtime import graph_replay

    def live():
        return {id(o) for o in gc.get_objects() if issubclass(type(o), graph_replay.GraphReplay)}

    before = live()

    def f(x):
        return torch.sin(x) * 2 + 1

    c = kiln.compile(f, backend="kiln", mode=mode)
    for _ in range(4):
        x = torch.randn(1024, device="cuda")
        torch.testing.assert_close(c(x), f(x))
    assert bool(live() - before) == replayed
