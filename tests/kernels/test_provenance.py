"""Generated kernels name the user's lines they compute: KILN_LOGS=output_code shows,
under each kernel's header, ``file:line in function: source`` of the nodes it fuses."""
import inspect
import logging

import torch

import kiln
from kiln.kernels import provenance


def _model(x, w):
    h = torch.nn.functional.gelu(x @ w)
    return h.softmax(-1) * 2


def _line_of(fn, text):
    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(src) if text in s)


def test_output_code_names_the_user_lines(caplog):
    kiln.reset()
    f = kiln.compile(_model, backend="kiln", fullgraph=True)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with caplog.at_level(logging.INFO, logger="kiln.output_code"):
        torch.testing.assert_close(f(x, w), _model(x, w))
    text = caplog.text
    gelu = _line_of(_model, "gelu(x @ w)")
    soft = _line_of(_model, "softmax(-1)")
    assert f"{__file__}:{gelu} in _model: h = torch.nn.functional.gelu(x @ w)" in text
    assert f"{__file__}:{soft} in _model: return h.softmax(-1) * 2" in text
    # each user line sits under a kernel header ("// kernel N: ...; from ...")
    lines = text.splitlines()
    at = next(i for i, s in enumerate(lines) if f":{soft} in _model" in s)
    assert any(s.lstrip().startswith("// kernel") for s in lines[max(0, at - 3):at])


def test_annotate_places_lines_under_headers_only():
    src = "// kernel 0: pointwise; from add_1, mul_2\nvoid k0() {}\n# kernel1: x; from sin\n"
    lines = {"add_1": ("m.py", 3, "f"), "mul_2": ("m.py", 3, "f"), "sin": ("m.py", 5, "g")}
    out = provenance.annotate(src, lines).splitlines()
    assert out == ["// kernel 0: pointwise; from add_1, mul_2", "//   m.py:3 in f: ",
                   "void k0() {}", "# kernel1: x; from sin", "#   m.py:5 in g: "]
    assert provenance.annotate(src, {}) == src
