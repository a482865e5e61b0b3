"""Compiling distributed training: DDP graphs split at gradient buckets (``ddp.py``,
``buckets.py``, ``split.py``) and FSDP2's per-block compilation (``blocks.py``)."""
