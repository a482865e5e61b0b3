"""Compiling distributed training: ``kiln.compile(DDP(m))`` splits graphs at DDP's
gradient buckets (``ddp.py``, ``buckets.py``, ``split.py``); ``compile_blocks`` compiles
blocks one by one for FSDP2 (``blocks.py``)."""
from kiln.distributed.blocks import compile_blocks

__all__ = ["compile_blocks"]
