"""The saved-bytes report through capture (``kiln.autograd.report.measure``): kiln's
compiled training step keeps no more bytes for backward than eager's."""
from __future__ import annotations

import pytest
import torch

from kiln.autograd.report import _lm_loss, gpt2_lm, measure
from tests.autograd.test_aot_eager import ConvBN


def _check(rows):
    eager_act = rows["eager"][1]
    for who in ("kiln aot_eager", "kiln core ops"):
        total, act, graphs = rows[who]
        assert graphs >= 1, who                 # compiled, not run eagerly
        assert act <= eager_act, (who, act, eager_act)


def test_conv_bn_saves_no_more_than_eager():
    rows = measure(ConvBN().train(), lambda: [torch.randn(4, 3, 16, 16)],
                   lambda m, x: m(x).sum())
    _check(rows)
    # batch norm kept whole under aot_eager: exactly eager's saved set
    assert rows["kiln aot_eager"][1] == rows["eager"][1]


def test_gpt2_lm_head_model_saves_no_more_than_eager():
    pytest.importorskip("transformers")
    m = gpt2_lm(n_layer=2, n_embd=32, n_head=4, vocab=64)
    rows = measure(m, lambda: [torch.randint(0, 64, (2, 16))], _lm_loss)
    _check(rows)
