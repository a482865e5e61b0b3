"""One catalogue of op knowledge, read by every stage (``catalogue.py``): which ops are
kept whole or decomposed, library calls, recomputable, have a meta shortcut, and where
they are lowered; and what an op's schema says (``schema.py``)."""
from .catalogue import (CATALOGUE, EXTRA_ALLOWED, EXTRA_DECOMPOSE, KEEP_WHOLE, OpInfo,
                        info, is_kiln_op, is_library_call, is_recomputable, meta_shortcut,
                        ops_named)
from .schema import is_mutation, is_random, is_view

__all__ = ["CATALOGUE", "EXTRA_ALLOWED", "EXTRA_DECOMPOSE", "KEEP_WHOLE", "OpInfo", "info",
           "is_kiln_op", "is_library_call", "is_recomputable", "meta_shortcut", "ops_named",
           "is_mutation", "is_random", "is_view"]
