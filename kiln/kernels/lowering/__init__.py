"""Lowering: aten graph → loop IR, one lowering per op in the ``LOWERINGS`` table.

``base`` holds the boxes, the table and the helpers every family shares; ``engine``
(``GraphLowering``) walks a graph with the table. Importing this package registers
every op family: the ones below each add their ``@register`` entries, in this order
(a later family may take over an op); ``checks`` comes last, as it wraps lowerings
registered before it.
"""
from .base import LOWERINGS, Lazy, Unsupported, View, register  # noqa: F401
from .engine import GraphLowering  # noqa: F401
from . import pointwise, shapes, reductions, conv  # noqa: F401,E402  (register their lowerings)
from . import index, matmul, pool, resample, view, foreach  # noqa: F401,E402
from . import checks  # noqa: F401,E402  (last: wraps lowerings registered above)
