"""FSDP2 (fully_shard) with each block's forward compiled by kiln, on 2 gloo ranks,
against eager FSDP2 over 3 optimizer steps."""
import pytest
import torch.distributed as dist

from . import ranks, workers

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")


@pytest.mark.slow
def test_fsdp2_per_block_adam():
    ranks.run(workers.fsdp2_against_eager, "adam", "aot_eager")


@pytest.mark.slow
def test_fsdp2_per_block_sgd_kiln_kernels():
    ranks.run(workers.fsdp2_against_eager, "sgd", "kiln")
