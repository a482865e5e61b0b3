"""Rank bodies of the distributed tests (module level, so spawned ranks import them).
Each compares kiln with eager on the same rank, over steps of a real optimizer."""
from __future__ import annotations

import contextlib

import torch

from . import models


def _optimizer(name, params):
    return {"sgd": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9),
            "adam": lambda: torch.optim.Adam(params, lr=1e-2)}[name]()


def _counting(backend_name, graphs):
    import kiln

    inner = kiln.lookup_backend(backend_name)

    def backend(gm, example_inputs):
        graphs.append(gm)
        return inner(gm, example_inputs)
    return backend


def _same(a, b, what, exact):
    if exact:
        assert torch.equal(a, b), f"{what} differs: max {float((a - b).abs().max())}"
    else:
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: {m}")


def ddp_against_eager(rank, world, order, opt_name, backend_name, model_name="chain", steps=3,
                      ddp_kwargs=None, accumulate=1):
    """kiln.compile(DDP(m)) ("outer") or DDP(kiln.compile(m)) ("inner") against eager
    DDP: losses, gradients and parameters after each step; the graph count against the
    buckets DDP's reducer ended up with. ``accumulate`` > 1: that many micro-batches a
    step, all but the last under ``no_sync()``."""
    import kiln
    from torch.nn.parallel import DistributedDataParallel as DDP

    exact = backend_name != "kiln"
    graphs: list = []
    build = {"chain": models.chain, "stack": models.Stack, "breaking": models.Breaking}[model_name]
    features = 8 if model_name == "stack" else models.WIDTH
    kw = dict(bucket_cap_mb=models.BUCKET_MB, **(ddp_kwargs or {}))
    ref = DDP(build(), **kw)
    model = build()
    if order == "outer":
        run = kiln.compile(DDP(model, **kw), backend=_counting(backend_name, graphs))
    else:
        run = DDP(kiln.compile(model, backend=_counting(backend_name, graphs)), **kw)
    opt_ref, opt = _optimizer(opt_name, ref.parameters()), _optimizer(opt_name, model.parameters())
    for step in range(steps):
        losses = []
        for fn in (ref, run):
            for micro in range(accumulate):
                x = models.batch(rank, step * accumulate + micro, features)
                sync = fn.no_sync() if micro < accumulate - 1 else contextlib.nullcontext()
                with sync:
                    loss = fn(x).pow(2).mean()
                    loss.backward()
            losses.append(loss)
        _same(losses[0], losses[1], f"loss at step {step}", exact)
        for (name, p), q in zip(ref.module.named_parameters(), model.parameters()):
            _same(p.grad, q.grad, f"grad of {name} at step {step}", exact)
        for o in (opt_ref, opt):
            o.step()
            o.zero_grad()
        for (name, p), q in zip(ref.module.named_parameters(), model.parameters()):
            _same(p, q, f"{name} after step {step}", exact)
    buckets = len(ref.reducer._get_zeros_like_grad_buckets())
    assert buckets >= 3, buckets
    if order == "outer":  # every captured graph (a resume function's too) was cut
        plans = run._kiln_split.plans
        assert plans and all(plan.cuts for plan in plans), [plan.describe() for plan in plans]
        assert len(plans) >= (2 if model_name == "breaking" else 1), len(plans)
    if order == "inner":
        assert len(graphs) == 1, len(graphs)
    elif model_name == "chain":  # bucket-aligned layers: one graph per bucket
        assert len(graphs) >= buckets, (len(graphs), buckets)
    else:  # buckets may share a layer's piece
        assert len(graphs) >= 3, (len(graphs), buckets)


def ddp_overlap(rank, world, split, expect_before):
    """How many bucket all-reduces DDP starts before the gradient of the model's input
    (the end of the backward) is computed: with the split, all buckets but the first
    layer's; in one graph, none."""
    import kiln
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    kiln.config.ddp_split = split
    ddp = DDP(models.chain(), bucket_cap_mb=models.BUCKET_MB)
    events: list[str] = []

    def hook(state, bucket):
        events.append("bucket")
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    run = kiln.compile(ddp, backend="aot_eager")
    for step in range(2):  # the reducer rebuilds its buckets after the first step
        events.clear()
        x = models.batch(rank, step).requires_grad_()
        x.register_hook(lambda g: events.append("input") or g)
        run(x).sum().backward()
    assert events.count("bucket") == 4, events
    assert events.index("input") == expect_before, events


def fsdp2_against_eager(rank, world, opt_name, backend_name, steps=3):
    """Per-block compilation under FSDP2 against eager FSDP2: each block's forward
    compiled (``kiln.distributed.compile_blocks``), then ``fully_shard`` on each block
    and the root; losses, local gradient and parameter shards after each step."""
    from torch.distributed.fsdp import fully_shard

    from kiln.distributed import compile_blocks

    exact = backend_name != "kiln"
    graphs: list = []

    def build(compiled):
        m = models.Stack()
        if compiled:
            compile_blocks(m.layers, backend=_counting(backend_name, graphs))
        for block in m.layers:
            fully_shard(block)
        fully_shard(m)
        return m

    ref, model = build(False), build(True)
    opt_ref, opt = _optimizer(opt_name, ref.parameters()), _optimizer(opt_name, model.parameters())
    for step in range(steps):
        x = models.batch(rank, step, 8)
        losses = []
        for m in (ref, model):
            loss = m(x).pow(2).mean()
            loss.backward()
            losses.append(loss)
        _same(losses[0], losses[1], f"loss at step {step}", exact)
        for (name, p), q in zip(ref.named_parameters(), model.parameters()):
            _same(p.grad.to_local(), q.grad.to_local(), f"grad of {name} at step {step}", exact)
        for o in (opt_ref, opt):
            o.step()
            o.zero_grad()
        for (name, p), q in zip(ref.named_parameters(), model.parameters()):
            _same(p.to_local(), q.to_local(), f"{name} after step {step}", exact)
    assert len(graphs) == len(model.layers), len(graphs)  # one per block, no recompiles
