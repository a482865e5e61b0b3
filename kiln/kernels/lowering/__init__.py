"""Lowering: aten graph → loop IR (one lowering per op, registered in ``LOWERINGS``)."""
from .engine import LOWERINGS, GraphLowering, Unsupported, View  # noqa: F401
