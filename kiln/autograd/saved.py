"""Bytes kept alive for the backward: kiln's partition vs PyTorch eager's autograd.

Eager's figure counts every tensor the autograd graph packs while the forward runs
(``torch.autograd.graph.saved_tensors_hooks``), each storage once (eager often saves the
same tensor for several ops, or an input and its view). kiln's figure is the bytes of
the values the min-cut partitioner saves, the same quantity for the compiled graph.
"""
from __future__ import annotations

import torch

from kiln.autograd.partition import nbytes, partition
from kiln.autograd.trace import trace_joint


def eager_saved_bytes(fn, *args, inputs=()) -> tuple[int, int]:
    """Run ``fn(*args)`` eagerly with grad. Returns (total, activations): bytes of the
    distinct storages autograd saves for backward, and the same without the storages
    of ``inputs`` (parameters, buffers, user inputs — alive anyway)."""
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr() or id(st)] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    held = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    return sum(seen.values()), sum(v for k, v in seen.items() if k not in held)


def kiln_saved_bytes(gm, example_inputs, recompute: bool | None = None) -> tuple[int, int]:
    """(total, activations) bytes kiln's partition saves for backward for ``gm``;
    activations leave out saved inputs (placeholders)."""
    tr = trace_joint(gm, example_inputs, train=True)
    part = partition(tr.graph, tr.num_fw_outputs, [i for i, _ in tr.mutations],
                     recompute=recompute)
    inputs = sum(nbytes(n) for n in part.saved if n.op == "placeholder")
    return part.saved_bytes, int(part.saved_bytes - inputs)


def saved_bytes_table(gm, example_inputs, eager_fn, eager_args) -> dict:
    """{name: (total, activations)} for eager, kiln, kiln without recomputation."""
    return {
        "eager": eager_saved_bytes(eager_fn, *eager_args, inputs=example_inputs),
        "kiln": kiln_saved_bytes(gm, example_inputs, recompute=True),
        "kiln (no recompute)": kiln_saved_bytes(gm, example_inputs, recompute=False),
    }


def format_table(rows: dict[str, dict]) -> str:
    """Rows of {model: saved_bytes_table(...)} as a readable MiB table."""
    lines = [f"{'model':<12} {'who':<20} {'total MiB':>10} {'activations MiB':>16}"]
    for model, table in rows.items():
        for who, (total, act) in table.items():
            lines.append(f"{model:<12} {who:<20} {total / 2**20:10.2f} {act / 2**20:16.2f}")
    return "\n".join(lines)
