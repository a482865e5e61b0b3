"""Issue 26's three CPU inference rows, eager against kiln, in one process:

    PYTHONPATH=. python -m benchmarks.probes.cpu_issue_rows [--calls 60]

resnet18 (batch 1, 128 px), mobilenet_v3_small (batch 8, 128 px) and a 4-layer BERT of
width 256 (batch 4 x 128 tokens), fp32, random weights. Each row: the compiled output
checked against eager's, then two alternating rounds of ``--calls`` timed calls per
backend, the lower median of the two kept (a shared 2-core machine drifts between
rounds). A quick look between full suite runs, not the suite's table
(``python -m benchmarks --device cpu``), which adds torch.compile.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def _median_ms(fn, args, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def row(name: str, model, args, calls: int) -> str:
    import kiln
    model.eval()
    compiled = kiln.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-3, atol=1e-3)
        for _ in range(15):
            compiled(*args)
            model(*args)
        eager = min(_median_ms(model, args, calls), _median_ms(model, args, calls))
        ours = min(_median_ms(compiled, args, calls), _median_ms(compiled, args, calls))
    return f"{name:30s} eager {eager:7.2f} ms  kiln {ours:7.2f} ms  {eager / ours:5.2f}x eager"


class _LastHidden(torch.nn.Module):
    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, ids):
        return self.bert(ids).last_hidden_state


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=60)
    a = p.parse_args(argv)
    import torchvision
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    print(row("resnet18 b1 128px", torchvision.models.resnet18(),
              (torch.randn(1, 3, 128, 128),), a.calls), flush=True)
    print(row("mobilenet_v3_small b8 128px", torchvision.models.mobilenet_v3_small(),
              (torch.randn(8, 3, 128, 128),), a.calls), flush=True)
    cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024)
    print(row("BERT 4x256 b4x128", _LastHidden(BertModel(cfg)),
              (torch.randint(0, 1000, (4, 128)),), a.calls), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
