"""Triton kernels that differ only in their sizes share one kernel text, hence one
binary (``kiln/kernels/codegen/triton/source.py``: each kernel numbers its size
arguments itself; each launch reads its own values from its slot of the device array).
The plan is counted in process (no Triton needed); the values are checked by Triton's
interpreter in a child pytest (``size_dedupe_triton_cases.py``)."""
import os
import re
import subprocess
import sys

import pytest

from kiln.kernels import compile as kc
from kiln.kernels.codegen.triton.source import layout

from .size_dedupe_cases import FIVE, graph, inputs, norm_graph, norm_inputs, sum_graph, sum_inputs

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _plan(numels):
    return kc.plan(graph(numels), inputs(numels), "triton")


def test_adam_update_over_five_sizes_is_one_kernel():
    """The update of five parameters of five sizes (one class): one kernel besides the
    step counter's, launched five times, each launch's slot holding its own numel."""
    p = _plan(FIVE)
    names = [k[0] for k in p.kinfo]
    assert len(names) == 2, names
    launched = re.findall(r"launch\(rt, (kernel\d+), G\[(\d+)\], \((.*?)\)", p.source)
    update = [(int(j), args) for name, j, args in launched if "K[" in args]
    assert len(update) == 5 and len({name for name, _, a in launched if "K[" in a}) == 1
    sizes = p.size_args
    got = sorted(sizes.device[sizes.slots[j][0]] for j, _ in update)
    assert got == FIVE, (got, sizes)
    for j, args in update:
        assert f"K[{j}]" in args


def test_classes_and_equalities_stay_in_the_text():
    """Dedupe never merges what a literal would tell apart: a numel no multiple of 16
    (no ``tl.multiple_of``) is another kernel, shared by both such numels."""
    p = _plan([528, 530, 640, 531])
    assert len(p.kinfo) == 3, [k[0] for k in p.kinfo]
    multiple = [k for k in p.kinfo if "tl.multiple_of" in _text(p.source, k[0])]
    assert len(multiple) == 1
    slots = [s for s in p.size_args.slots if s is not None]
    assert len(slots) == 4 and len(set(slots)) == 4


def _text(source, name):
    return source[source.index(f"def {name}("):].split("\n\n\n")[0]


def test_reductions_named_after_their_buffers_dedupe():
    """Two column sums of one class over different buffers: one kernel, though each
    names its accumulator after its own output (``acc_bufN``)."""
    p = kc.plan(sum_graph(), sum_inputs(), "triton")
    assert len(p.kinfo) == 2, [k[0] for k in p.kinfo]
    assert re.search(r"acc_buf\d+ = ", p.source)


def test_repeated_blocks_with_inner_reductions_share_one_kernel():
    """Two residual + LayerNorm blocks: one kernel text, launched twice, though each
    copy's mean and variance (kept inside, never stored) are named after its own
    buffers. Regional compilation on the GPU rests on this: a 24-layer GPT-2 compiled
    two such kernels more per layer before the dedupe key renamed inner names."""
    p = kc.plan(norm_graph(), norm_inputs(), "triton")
    launched = re.findall(r"launch\(rt, (kernel\d+), ", p.source)
    texts = [_text(p.source, k[0]) for k in p.kinfo]
    norms = [t for t in texts if "tl.sum" in t]
    assert len(norms) == 1, [k[0] for k in p.kinfo]
    assert re.search(r"acc_buf\d+ = ", norms[0])
    name = re.search(r"def (kernel\d+)\(", norms[0]).group(1)
    assert launched.count(name) == 2, launched


def test_layout_aligns_every_slot():
    """Every launch's sizes start 16 bytes apart from the array's start (Triton
    specialises pointers on 16-byte alignment: one binary for all launches), and
    launches of equal values share a slot."""
    device, slots = layout([[5], [], [7, 8, 9], [5], [1, 2]])
    assert slots == [(0, 1), None, (2, 3), (0, 1), (6, 2)]
    assert device == [5, 0, 7, 8, 9, 0, 1, 2]
    assert all(s[0] % 2 == 0 for s in slots if s)


@pytest.mark.slow   # (the quick subset's time: run in full CI)
def test_dedupe_under_the_interpreter(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_TEST_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           os.path.join(HERE, "size_dedupe_triton_cases.py"), "--rootdir", ROOT]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "4 passed" in r.stdout.splitlines()[-1], r.stdout[-2000:]
