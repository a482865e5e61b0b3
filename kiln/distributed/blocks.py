"""Per-block compilation, the way FSDP2 (``fully_shard``) and torchtitan want it.

FSDP2 all-gathers a block's parameters in a forward pre-hook, frees them in a forward
hook, and reduce-scatters gradients from hooks the backward reaches; those hooks are
collectives and storage tricks that only eager can run. So each block's *forward* is
compiled and its module call is not: the hooks run around the compiled forward, as in
eager FSDP2, and the forward sees the gathered (plain) parameters. Compiling before or
after ``fully_shard`` is the same: the compiled forward is an attribute of the block's
instance, which survives FSDP2 swapping the block's class.
"""
from __future__ import annotations

from typing import Iterable

import torch


def compile_blocks(blocks: Iterable[torch.nn.Module], **compile_kwargs) -> list[torch.nn.Module]:
    """Compile each block's forward with ``kiln.compile(**compile_kwargs)`` in place
    (``block.forward``); returns the blocks. Hooks on the blocks stay eager."""
    from kiln.capture.api import compile as kiln_compile

    done = []
    for block in blocks:
        if "forward" in block.__dict__:
            raise ValueError(f"{type(block).__name__} already has an instance forward "
                             "(compiled twice, or patched): compile_blocks would replace it")
        block.forward = kiln_compile(block.forward, **compile_kwargs)
        done.append(block)
    return done
