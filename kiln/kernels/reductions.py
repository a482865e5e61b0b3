"""The reduction kinds of the loop IR, with how each starts, updates, combines and
finishes in C++ and in Triton.

One row per kind, like the scalar-op table (``ops.py``): adding a kind means adding a
row here (and a lowering that makes ``ir.Reduction``s of it; a combine helper in a
prelude if its Triton update needs one). The code generators read only these fields,
never the kind's name.

Templates take the accumulator as ``{a}`` and the new value as ``{v}``. An *arg* kind
(argmax/argmin) keeps the best value and its index: it compares with ``arg_cmp`` and
starts from its own ``identity`` for the value; its result is the index.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str
    #: the start value: 0, 1, False, or "lowest"/"highest" (of the value's dtype:
    #: -inf/inf for floats); each backend spells it (``cpp``/``triton`` ``identity``)
    identity: object
    #: C++: one step of the loop (None for arg kinds), and the OpenMP reduction operator
    cpp_update: str | None = None
    cpp_clause: str | None = None
    #: Triton: one step on the accumulator block ([XBLOCK, RBLOCK], or [RBLOCK, XBLOCK]
    #: for a column reduction). With ``triton_fill`` the masked-off lanes read that
    #: value; without, they keep the accumulator.
    triton_update: str | None = None
    triton_fill: str | None = None
    #: Triton: the accumulator's lanes reduced to one value per output, along the
    #: block's reduced ``{axis}``
    triton_finish: str | None = None
    #: Triton: the dtype of the accumulator, when not the value's compute dtype
    triton_acc: str | None = None
    #: the kind that combines this kind's partial results (split reductions); None:
    #: the reduction is never split
    combine: str | None = None
    #: arg kinds: the comparison that makes a value the new best, and the Triton
    #: combine of (value, index) pairs (in the prelude)
    arg_cmp: str | None = None
    triton_arg_combine: str | None = None
    #: max/min over floats: a NaN seen anywhere is the result (tracked beside the
    #: accumulator in C++, where std::max drops NaNs)
    tracks_nan: bool = False
    #: float32 sums are accumulated in compensated blocks on the CPU
    compensated: bool = False
    #: accumulates in a wider type than the result (Triton casts back at the end)
    widens: bool = False

    @property
    def is_arg(self) -> bool:
        return self.arg_cmp is not None

    @property
    def has_identity_for_empty(self) -> bool:
        """An empty reduction of this kind has a value (sum → 0); max of nothing raises."""
        return self.identity in (0, 1, False) and not self.is_arg


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("sum", 0, cpp_update="{a} += {v};", cpp_clause="+",
         triton_update="{a} + {v}", triton_fill="0", triton_finish="tl.sum({a}, {axis})",
         combine="sum", compensated=True, widens=True),
    Kind("prod", 1, cpp_update="{a} *= {v};", cpp_clause="*",
         triton_update="{a} * {v}", triton_fill="1",
         triton_finish="tl.reduce({a}, {axis}, kiln_prod_combine)", combine="prod", widens=True),
    Kind("max", "lowest", cpp_update="{a} = std::max({a}, {v});", cpp_clause="max",
         triton_update="kiln_maximum({a}, {v})", triton_finish="tl.reduce({a}, {axis}, kiln_maximum)",
         combine="max", tracks_nan=True),
    Kind("min", "highest", cpp_update="{a} = std::min({a}, {v});", cpp_clause="min",
         triton_update="kiln_minimum({a}, {v})", triton_finish="tl.reduce({a}, {axis}, kiln_minimum)",
         combine="min", tracks_nan=True),
    Kind("any", False, cpp_update="{a} = {a} || {v};", cpp_clause="||",
         triton_update="{a} | {v}.to(tl.int8)", triton_fill="0",
         triton_finish="tl.max({a}, {axis}) != 0", triton_acc="int8", combine="any"),
    Kind("argmax", "lowest", arg_cmp=">", triton_arg_combine="kiln_argmax_combine"),
    Kind("argmin", "highest", arg_cmp="<", triton_arg_combine="kiln_argmin_combine"),
)}
