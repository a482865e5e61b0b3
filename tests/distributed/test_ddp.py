"""kiln.compile(DDP(m)) and DDP(kiln.compile(m)) on 2 gloo ranks against eager DDP:
losses, gradients and parameters over 3 optimizer steps; graphs cut at the buckets."""
import pytest
import torch.distributed as dist

from . import ranks, workers

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")


@pytest.mark.slow   # (the quick subset's time: run in full CI)
def test_outer_ddp_splits_at_buckets_sgd():
    ranks.run(workers.ddp_against_eager, "outer", "sgd", "aot_eager")


@pytest.mark.slow
def test_outer_ddp_adam():
    ranks.run(workers.ddp_against_eager, "outer", "adam", "aot_eager")


@pytest.mark.slow
def test_inner_ddp_one_graph():
    ranks.run(workers.ddp_against_eager, "inner", "adam", "aot_eager")


@pytest.mark.slow
def test_outer_ddp_kiln_kernels():
    ranks.run(workers.ddp_against_eager, "outer", "sgd", "kiln")


@pytest.mark.slow
@pytest.mark.parametrize("split,before", [(True, 3), (False, 0)])
def test_buckets_reduce_before_backward_ends(split, before):
    ranks.run(workers.ddp_overlap, split, before)


@pytest.mark.slow
def test_outer_ddp_transformer_blocks():
    ranks.run(workers.ddp_against_eager, "outer", "adam", "aot_eager", "stack")


@pytest.mark.slow
@pytest.mark.parametrize("kwargs,accumulate", [
    ({"find_unused_parameters": True}, 1),
    ({"static_graph": True}, 1),
    ({"gradient_as_bucket_view": True}, 2),
], ids=["find_unused", "static_graph", "bucket_view_no_sync"])
def test_outer_ddp_options(kwargs, accumulate):
    ranks.run(workers.ddp_against_eager, "outer", "sgd", "aot_eager", "chain", 3, kwargs, accumulate)


@pytest.mark.slow
def test_outer_ddp_graph_break():
    """Both graphs around a break (the frame's and its resume function's) are cut."""
    ranks.run(workers.ddp_against_eager, "outer", "sgd", "aot_eager", "breaking")
