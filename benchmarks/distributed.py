"""Distributed training step time: DDP or FSDP2, eager / torch.compile / kiln.

    torchrun --nproc-per-node N -m benchmarks.distributed --model gpt2|llama \\
        --mode ddp|fsdp2 --backends eager,torch.compile,kiln --steps K [--trace DIR]

Picks nccl when CUDA is available (one GPU per rank, ``LOCAL_RANK``) and gloo on the
CPU. Sizes default to GPT-2 small (12 layers, hidden 768, batch 8 x 512) on a GPU and a
small model on the CPU (4 layers, hidden 128: about 4 MB of parameters, several 1 MB
buckets; a cap under 1 MB trips an assertion in torch.compile's DDP optimizer, whose
first bucket is 1 MB); every size is a flag. A step is forward with the language-model
loss, ``loss.backward()``, AdamW's step and ``zero_grad``.

How each backend compiles:
- ``ddp``: eager ``DDP(m)``; ``torch.compile(DDP(m))`` (its DDP optimizer splits graphs at
  buckets); ``kiln.compile(DDP(m))`` (kiln/distributed/ddp.py splits likewise).
- ``fsdp2``: ``fully_shard`` on each transformer block and the root; compiled backends
  compile each block's forward first (``kiln.distributed.compile_blocks``; for
  torch.compile ``block.forward = torch.compile(block.forward)``), the FSDP2 hooks
  around them eager.

The forward runs under ``torch.autocast`` (``--autocast``, bf16 by default on a GPU).
Rank 0 prints a table and writes JSON (``--json``): per backend the slowest rank's
median step time over ``--steps`` timed steps after ``--warmup`` steps (the first
compiles, kiln's perf-fallback trials and CUDA-graph recordings; ``times_ms`` in the JSON
has every step), the first step's time, each rank's peak CUDA memory above what was allocated
before the backend's model was built, and ``loss_err``, the largest relative difference
of the first ``--loss-steps`` losses (10) from eager's (each backend starts from the same
seed; ``loss_at`` gives the last of them, the backend's and eager's). ``--trace
DIR`` profiles 3 more steps per backend and writes one Chrome trace per rank and
backend (``DIR/<backend>-rank<r>.json``); the table's ``comm<bwd`` column gives, per
rank, ``overlapped/total``: of the collectives issued once a profiled step's backward
began, how many were issued before its last backward computation ended (communication
that can overlap the backward; one graph issues them all at its end); on a GPU
``comm hidden`` is, per rank, the share of NCCL's all-reduce / reduce-scatter kernel time
during which a computation kernel ran (``gpu_comm_overlap``).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

_GPU = dict(layers=12, hidden=768, heads=12, vocab=50257, seq=512, batch=8, bucket_cap_mb=25.0)
_CPU = dict(layers=4, hidden=128, heads=2, vocab=1024, seq=32, batch=2, bucket_cap_mb=1.0)
_COMM = re.compile(r"c10d::")  # a collective issued (the launch, not the transport's work)
_BACKWARD = "autograd::engine::evaluate_function"


def parse(argv=None):
    p = argparse.ArgumentParser(prog="torchrun ... -m benchmarks.distributed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--mode", choices=["ddp", "fsdp2"], default="ddp")
    p.add_argument("--backends", default="eager,torch.compile,kiln")
    p.add_argument("--steps", type=int, default=10, help="timed steps per backend")
    p.add_argument("--warmup", type=int, default=15,
                   help="steps before timing: the first compiles, and kiln's first calls of each graph "
                        "time it against eager (perf fallback) and record its CUDA graph")
    for k in ("layers", "hidden", "heads", "vocab", "seq", "batch"):
        p.add_argument(f"--{k}", type=int, default=None, help="default: GPT-2 small on a GPU, tiny on the CPU")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP's bucket_cap_mb (default 25 on a GPU, 1 on the CPU so the small model has several buckets)")
    p.add_argument("--json", default="", help="default: distributed-<model>-<mode>-ws<N>.json")
    p.add_argument("--trace", default="", help="write profiler traces here")
    p.add_argument("--autocast", choices=["bf16", "fp16", "none"], default=None,
                   help="the forward under torch.autocast (default: bf16 on a GPU, none on the CPU)")
    p.add_argument("--loss-steps", type=int, default=10,
                   help="steps whose losses are compared with eager's (loss_err; loss_at is the last)")
    return p.parse_args(argv)


def setup():
    """(rank, world, device) after joining the process group torchrun describes (a
    single process without torchrun is world size 1)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    cuda = torch.cuda.is_available()
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    return dist.get_rank(), dist.get_world_size(), device


class LMLoss(torch.nn.Module):
    """The language model's own loss on next-token labels (the inputs)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, labels=ids).loss


def build_model(a, device):
    torch.manual_seed(0)
    if a.model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=a.vocab, n_positions=max(1024, a.seq), n_embd=a.hidden, n_layer=a.layers,
                         n_head=a.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
        lm = GPT2LMHeadModel(cfg)
        blocks = lm.transformer.h
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden,
                          intermediate_size=(8 * a.hidden // 3 + 63) // 64 * 64, num_hidden_layers=a.layers,
                          num_attention_heads=a.heads, num_key_value_heads=max(1, a.heads // 2),
                          max_position_embeddings=max(2048, a.seq), use_cache=False)
        lm = LlamaForCausalLM(cfg)
        blocks = lm.model.layers
    return LMLoss(lm).to(device), list(blocks)


def wrap(backend: str, a, model, blocks):
    """The callable a step runs, for one backend and mode."""
    if a.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [next(model.parameters()).device.index] if next(model.parameters()).is_cuda else None
        ddp = DDP(model, device_ids=ids, bucket_cap_mb=a.bucket_cap_mb)
        if backend == "eager":
            return ddp
        if backend == "torch.compile":
            return torch.compile(ddp)
        import kiln

        return kiln.compile(ddp)
    from torch.distributed.fsdp import fully_shard

    if backend == "torch.compile":
        for b in blocks:
            b.forward = torch.compile(b.forward)
    elif backend == "kiln":
        from kiln.distributed import compile_blocks

        compile_blocks(blocks)
    for b in blocks:
        fully_shard(b)
    fully_shard(model)
    return model


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _amp(a, device):
    """The autocast context a step's forward runs in."""
    if a.autocast == "none":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[a.autocast])


def train_step(step_fn, opt, ids, a, device):
    """One step: forward and loss under ``--autocast``, backward, AdamW, zero_grad."""
    with _amp(a, device):
        loss = step_fn(ids)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def defaults(a, device) -> None:
    """Fill the sizes and autocast left unset for ``device`` (GPT-2 small and bf16 on a
    GPU, a small model in fp32 on the CPU)."""
    for k, v in (_GPU if device.type == "cuda" else _CPU).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.autocast is None:
        a.autocast = "bf16" if device.type == "cuda" else "none"


def one_process(argv, port: int):
    """(args, device) in a process of world size 1 started without torchrun (the
    probes' set-up): ``argv`` as this benchmark's command line."""
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                 "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    a = parse(argv)
    _, _, device = setup()
    defaults(a, device)
    return a, device


def run_backend(backend, a, rank, device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    model, blocks = build_model(a, device)
    step_fn = wrap(backend, a, model, blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(100 + rank)
    batches = [torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(device) for _ in range(4)]

    def step(i):
        return train_step(step_fn, opt, batches[i % len(batches)], a, device)

    losses, times = [], []
    for i in range(max(a.warmup + a.steps, a.loss_steps)):
        sync(device)
        t0 = time.perf_counter()
        loss = step(i)
        sync(device)
        times.append(time.perf_counter() - t0)
        if i < a.loss_steps:
            losses.append(float(loss))
    row = {"backend": backend, "first_s": times[0], "times_ms": [round(1e3 * t, 2) for t in times],
           "median_ms": 1e3 * statistics.median(times[a.warmup:a.warmup + a.steps]), "losses": losses}
    if device.type == "cuda":
        row["peak_mb"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    if a.trace:
        row["comm_before_backward_end"], row["comm_overlap"] = profile(step, a, backend, rank, device)
    return row


def profile(step, a, backend, rank, device):
    """Profile 3 steps and write the Chrome trace; returns ([issued, total], overlap):
    of the collectives issued after a step's backward began, how many were issued before
    its last backward computation ended (gradient accumulation, which issues the
    all-reduces, not counted as computation); and, on a GPU, ``gpu_comm_overlap`` of the
    trace (None on the CPU)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    os.makedirs(a.trace, exist_ok=True)
    with torch_profile(activities=acts) as prof:
        for i in range(3):
            with torch.profiler.record_function(f"step{i}"):
                step(i)
        sync(device)
    path = os.path.join(a.trace, f"{backend}-rank{rank}.json")
    prof.export_chrome_trace(path)
    overlap = gpu_comm_overlap(path) if device.type == "cuda" else None
    events = list(prof.events())
    overlapped = total = 0
    for s in (e for e in events if re.fullmatch(r"step\d", e.name)):
        inside = [e for e in events if s.time_range.start <= e.time_range.start <= s.time_range.end]
        bwd = [e.time_range for e in inside
               if e.name.startswith(_BACKWARD) and not e.name.endswith("AccumulateGrad")]
        if not bwd:
            continue
        begin, end = min(r.start for r in bwd), max(r.end for r in bwd)
        issued = [e.time_range.start for e in inside if _COMM.match(e.name) and e.time_range.start >= begin]
        total += len(issued)
        overlapped += sum(1 for t in issued if t < end)
    return [overlapped, total], overlap


_REDUCING = re.compile(r"nccl.*(AllReduce|ReduceScatter)", re.I)


def gpu_comm_overlap(trace_path) -> dict:
    """From a Chrome trace's GPU kernels: the microseconds NCCL's all-reduce and
    reduce-scatter kernels ran, and how many of them ran while a computation kernel (any
    kernel not NCCL's) ran on another stream — the communication hidden behind compute."""
    with open(trace_path) as f:
        kernels = [e for e in json.load(f).get("traceEvents", [])
                   if e.get("cat") == "kernel" and e.get("ph") == "X"]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if _REDUCING.search(e["name"])]
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" not in e["name"].lower()])
    total = sum(b - a for a, b in comm)
    hidden = sum(max(0.0, min(b, y) - max(a, x)) for a, b in comm for x, y in busy)
    return {"comm_us": round(total, 1), "overlapped_us": round(hidden, 1),
            "fraction": round(hidden / total, 3) if total else None}


def _union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def main(argv=None) -> int:
    a = parse(argv)
    rank, world, device = setup()
    sizes = _GPU if device.type == "cuda" else _CPU
    defaults(a, device)
    rows = []
    for backend in [b.strip() for b in a.backends.split(",") if b.strip()]:
        try:
            row = run_backend(backend, a, rank, device)
        except Exception as e:  # noqa: BLE001  (one backend's failure is a row, not the end)
            row = {"backend": backend, "error": f"{type(e).__name__}: {e}"[:300]}
        gathered = [None] * world
        dist.all_gather_object(gathered, row)
        rows.append(_merge(gathered))
    ref = next((r for r in rows if r["backend"] == "eager" and "losses" in r), None)
    for r in rows:
        if ref and "losses" in r:
            r["loss_err"] = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(r["losses"], ref["losses"]))
            r["loss_at"] = [len(r["losses"]), r["losses"][-1], ref["losses"][-1]]
            r["speedup"] = ref["median_ms"] / r["median_ms"]
    if rank == 0:
        meta = {"model": a.model, "mode": a.mode, "world": world, "device": str(device),
                "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                "sizes": {k: getattr(a, k) for k in sizes}, "steps": a.steps, "warmup": a.warmup,
                "autocast": a.autocast, "loss_steps": a.loss_steps,
                "torch": torch.__version__, "comm_backend": dist.get_backend()}
        print(table(meta, rows))
        path = a.json or f"distributed-{a.model}-{a.mode}-ws{world}.json"
        with open(path, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        print(f"wrote {path}")
    dist.destroy_process_group()
    return 0


def _merge(per_rank):
    """One row: rank 0's, with the slowest rank's times and any rank's error."""
    row = dict(per_rank[0])
    errors = [r["error"] for r in per_rank if "error" in r]
    if errors:
        return {"backend": row["backend"], "error": errors[0]}
    row["median_ms"] = max(r["median_ms"] for r in per_rank)
    row["first_s"] = max(r["first_s"] for r in per_rank)
    for key in ("comm_before_backward_end", "comm_overlap", "peak_mb"):
        if key in row:
            row[key] = [r[key] for r in per_rank]
    return row


def _overlap(row) -> str:
    per_rank = row.get("comm_before_backward_end")
    return " ".join(f"{o}/{t}" for o, t in per_rank) if per_rank else "-"


def _peak(row) -> str:
    return "/".join(f"{m:.0f}" for m in row["peak_mb"]) if row.get("peak_mb") else "-"


def _hidden(row) -> str:
    per_rank = [o for o in row.get("comm_overlap") or [] if o and o["fraction"] is not None]
    return "/".join(f"{100 * o['fraction']:.0f}%" for o in per_rank) or "-"


def table(meta, rows) -> str:
    head = (f"{meta['mode']} {meta['model']} world {meta['world']} on {meta['gpu'] or meta['device']} "
            f"autocast {meta['autocast']} "
            f"({meta['comm_backend']}), sizes {meta['sizes']}")
    lines = [head, f"{'backend':<14} {'median ms':>10} {'first s':>8} {'speedup':>8} {'loss_err':>9} {'comm<bwd':>9}"
                   f" {'peak MB/rank':>14} {'comm hidden':>12}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['backend']:<14} error: {r['error']}")
            continue
        lines.append(f"{r['backend']:<14} {r['median_ms']:>10.2f} {r['first_s']:>8.2f} "
                     f"{r.get('speedup', float('nan')):>8.2f} {r.get('loss_err', float('nan')):>9.1e} "
                     f"{_overlap(r):>9} {_peak(r):>14} {_hidden(r):>12}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
