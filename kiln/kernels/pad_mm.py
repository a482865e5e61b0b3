"""Matrix products on misaligned shapes run on zero-padded operands (``config.pad_mm``).

cuBLAS's tensor-core kernels load their operands and store their result in 16-byte
vectors; they need every matrix's leading dimension (its row length in memory) and base
pointer to be multiples of 16 bytes — 8 elements of bf16/fp16, 4 of fp32 (TF32). A
GPT-2 LM head (vocabulary 50257) breaks that: cuBLAS falls back to its ``_align1``
kernels, several times slower than the aligned ones on the same work. This pass, run
on each aten graph before it is lowered (``compile.plan``), rewrites such an
``mm``/``addmm``/``bmm`` whose M, N or K is not a multiple of the alignment into the
same product on operands zero-padded up to it, then a slice back:

* padding K adds products of zeros to every dot product: the values are the same (to
  the rounding of a different kernel's summation order);
* padding M or N adds rows or columns to the result, which the slice leaves out.

The pads are ``constant_pad_nd`` nodes, pointwise to the kernel compiler, placed beneath
the transposes and reshapes between an operand and the value it views: that value (a
cast weight, the loss's gradient) is then computed inside the padding kernel, and the
products that read one tensor, one of them transposed (a Linear's two gradients), share
one padded copy. Other readers of a padded value read it back as a slice of the padded
buffer, so it is stored once. The sliced result is a strided view that later kernels
read in place; where the caller sees it (a graph output) it is copied to eager's
contiguous layout.

fp32 is padded only where cuBLAS runs it on tensor cores (TF32 allowed:
``torch.backends.cuda.matmul.fp32_precision == "tf32"``): plain fp32 products measured
the same padded or not. Products under ``config.pad_mm_min_flops`` stay as they are
(the copies would cost more than the kernel saves).

``KILN_LOGS=passes`` logs each product padded (and each misaligned one left, with why).

GPU probe (the issue's training step; compare the kiln rows of the two runs)::

    KILN_PAD_MM=0 python -m benchmarks.train_step --device cuda --model gpt2 --layers 12 \\
        --hidden 768 --batch 8 --seq 512 --vocab 50257 --autocast bf16 --optimizer adamw \\
        --backends eager,kiln
    KILN_PAD_MM=1 python -m benchmarks.train_step ...   (the same arguments)

and, for the three LM-head products alone, ``python benchmarks/probes/pad_mm_probe.py``
(cuBLAS per dtype and layout, then kiln with pad_mm 0 and 1).
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from .. import config
from ..debug.logs import log_for
from .devices import graph_device
from .lowering.base import STORAGE_OPS, returns_a_view
from .lowering.outputs import eager_root, output_roots

aten = torch.ops.aten
_log = log_for("passes")

#: elements in the 16 bytes cuBLAS's vectorised kernels load, per operand dtype
ALIGN = {torch.bfloat16: 8, torch.float16: 8, torch.float32: 4}


def _fp32_on_tensor_cores() -> bool:
    """Whether cuBLAS may run fp32 products as TF32: the matmul's ``fp32_precision``,
    else the global one, else the legacy ``allow_tf32`` (which raises where the two APIs
    were mixed: then no)."""
    try:
        for p in (getattr(torch.backends.cuda.matmul, "fp32_precision", None),
                  getattr(torch.backends, "fp32_precision", None)):
            if p in ("tf32", "ieee"):
                return p == "tf32"
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:
        return False


#: per dtype, when its products are worth padding (beyond alignment and size)
_DTYPE_RULE = {torch.bfloat16: lambda: True, torch.float16: lambda: True,
               torch.float32: _fp32_on_tensor_cores}


class _Op:
    """Where an op's operands are: ``mat1``/``mat2`` positions, the bias position
    (addmm) and how many batch dims lead (bmm)."""

    def __init__(self, mat1: int, mat2: int, bias: int | None = None, batch: int = 0):
        self.mat1, self.mat2, self.bias, self.batch = mat1, mat2, bias, batch


#: THE TABLE of products this pass rewrites
OPS = {
    aten.mm.default: _Op(0, 1),
    aten.addmm.default: _Op(1, 2, bias=0),
    aten.bmm.default: _Op(0, 1, batch=1),
    aten.baddbmm.default: _Op(1, 2, bias=0, batch=1),
}


def _permutation(n) -> list:
    """Result dim d of a permuting view is its argument's dim ``perm[d]``."""
    if n.target is aten.permute.default:
        return [d % len(n.args[1]) for d in n.args[1]]
    ndim = _val(n).dim()
    perm = list(range(ndim))
    if n.target is aten.transpose.int:
        d0, d1 = n.args[1] % ndim, n.args[2] % ndim
        perm[d0], perm[d1] = perm[d1], perm[d0]
    elif ndim == 2:                                     # t
        perm = [1, 0]
    return perm


def _through_permute(x, pads):
    """A transposed operand is padded beneath the transpose, on the value it views
    (``G.t()`` of a weight gradient shares the padded ``G`` of the input gradient). A
    contiguous result of a permute is padded as it is: that is its memory order."""
    if _val(x).is_contiguous():
        return None
    perm = _permutation(x)
    return ({perm[d]: k for d, k in pads.items()},
            lambda rw, base: rw.node(aten.permute.default, [base, perm], like=x))


def _through_reshape(x, pads):
    """A reshape of leading dims (``[B*S, V]`` of ``[B, S, V]``) is padded underneath:
    the value it views is then computed into the padded buffer directly (the kernel
    compiler stores a value before reshaping it). Only of a contiguous value: its padded
    copy is contiguous too, so viewing it is a reshape without a copy, as before."""
    v, b = _val(x), _val(x.args[0])
    if not b.is_contiguous():
        return None
    base_pads = {}
    for d, k in pads.items():
        tail = v.dim() - d
        if tail > b.dim() or tuple(v.shape[d:]) != tuple(b.shape[b.dim() - tail:]):
            return None
        base_pads[b.dim() - tail] = k
    sizes = [s + pads.get(d, 0) for d, s in enumerate(v.shape)]
    return base_pads, lambda rw, base: rw.node(aten.view.default, [base, sizes], like=x)


#: views the padding goes beneath: op -> rule(x, pads) -> (pads of x's argument,
#: rebuild(rewriter, padded argument) -> padded x), or None to pad x itself
SEE_THROUGH = {
    aten.permute.default: _through_permute,
    aten.t.default: _through_permute,
    aten.transpose.int: _through_permute,
    aten.view.default: _through_reshape,
    aten._unsafe_view.default: _through_reshape,
    aten.reshape.default: _through_reshape,
}


def _val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def _padded_length(size: int, align: int) -> int:
    """Elements to add so that ``size`` is a multiple of ``align`` (0 if it is)."""
    return -size % align


# --- deciding ---------------------------------------------------------------------------
def enabled(example_inputs) -> bool:
    """``config.pad_mm``: "1" pads CUDA graphs, "always" any (tests run it on the CPU),
    "0" none."""
    mode = str(config.pad_mm).strip().lower()
    if mode in ("0", "off", "false", "no", ""):
        return False
    if mode == "always":
        return True
    return graph_device(example_inputs).type == "cuda"


def _shapes_known(gm, example_inputs) -> bool:
    """The graph's recorded values have the example inputs' shapes and dtypes (then
    every node's recorded shape is the one it will compute)."""
    inputs = iter(example_inputs)
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        t, v = next(inputs, None), _val(n)
        if isinstance(t, torch.Tensor) != isinstance(v, torch.Tensor):
            return False
        if isinstance(t, torch.Tensor) and (tuple(t.shape) != tuple(v.shape) or t.dtype != v.dtype):
            return False
    return True


def leading_dims(a, b) -> set:
    """Which of M, K, N are a leading dimension (a row length in memory) of ``a``
    [.., M, K], ``b`` [.., K, N] or the row-major result [.., M, N] — the sizes cuBLAS
    needs aligned. M is one only when ``a`` is stored transposed: a misaligned M of a
    row-major ``a`` costs nothing (measured: 4097x1024 @ 1024x4096 bf16 ran as fast as
    its padded form). An operand with neither last dim dense is copied row-major by
    PyTorch."""
    lead = {"N"}
    lead.add("M" if a.stride(-1) != 1 and a.stride(-2) == 1 else "K")
    if b.stride(-1) != 1 and b.stride(-2) == 1:
        lead.add("K")
    return lead


class _Product:
    """What the rules read of one product: its node, operand values and sizes."""

    def __init__(self, node, a, b, batch, m, k, n):
        self.node, self.a, self.b = node, a, b
        self.batch, self.m, self.k, self.n = batch, m, k, n

    @property
    def flops(self) -> int:
        f = 2 * self.m * self.n * self.k
        for s in self.batch:
            f *= s
        return f


def _off_cuda(p) -> str | None:
    dev = p.node.meta.get("device")
    if str(config.pad_mm).strip().lower() != "always" and isinstance(dev, torch.device) \
            and dev.type != "cuda":
        return f"on {dev}, not a CUDA device"
    return None


def _fp32_without_tf32(p) -> str | None:
    if _DTYPE_RULE[p.a.dtype]():
        return None
    return "fp32 without TF32 runs no tensor-core kernel"


def _small(p) -> str | None:
    if p.flops >= config.pad_mm_min_flops:
        return None
    return f"{p.flops:.3g} flops < pad_mm_min_flops"


#: why a misaligned product is left as it is: rule(product) -> reason, or None
LEAVE = (_off_cuda, _fp32_without_tf32, _small)


def _storage_read(node) -> bool:
    """Is the product's result (or a view of it) read by an op that addresses its
    storage (``as_strided``)? A slice of a padded result has another storage."""
    work = list(node.users)
    while work:
        u = work.pop()
        if u.target in STORAGE_OPS:
            return True
        if u.op == "call_function" and returns_a_view(u.target):
            work.extend(u.users)
    return False


def plan_for(node) -> tuple | None:
    """(pad M, pad K, pad N, why) for a product node worth padding; (0, 0, 0, why) for a
    misaligned one left as it is; None when there is nothing to say."""
    spec = OPS.get(node.target)
    if spec is None:
        return None
    a, b, out = _val(node.args[spec.mat1]), _val(node.args[spec.mat2]), _val(node)
    if not all(isinstance(t, torch.Tensor) for t in (a, b, out)):
        return None
    if not (a.dtype == b.dtype == out.dtype) or a.dtype not in ALIGN:
        return None
    if spec.bias is not None and isinstance(node.args[spec.bias], fx.Node) and \
            not isinstance(_val(node.args[spec.bias]), torch.Tensor):
        return None
    sizes = list(a.shape) + [b.shape[-1]]
    if not all(isinstance(s, int) for s in sizes):
        return None
    *batch, m, k, n = sizes
    align = ALIGN[a.dtype]
    lead = leading_dims(a, b)
    pads = [_padded_length(s, align) if s > 1 and name in lead else 0
            for name, s in zip("MKN", (m, k, n))]
    if not any(pads):
        return None
    why = (f"{'x'.join(map(str, a.shape))} @ {'x'.join(map(str, b.shape))} {a.dtype}: "
           + ", ".join(f"{name} {s} -> {s + p}" for name, s, p in zip("MKN", (m, k, n), pads) if p)
           + f" (multiples of {align})")
    product = _Product(node, a, b, batch, m, k, n)
    for rule in LEAVE:
        reason = rule(product)
        if reason is not None:
            return 0, 0, 0, f"{why}; left: {reason}"
    if (pads[0] or pads[2]) and _storage_read(node):
        pads[0] = pads[2] = 0           # K alone keeps the result's shape and storage
        if not pads[1]:
            return 0, 0, 0, f"{why}; left: its result's storage is addressed (as_strided)"
    return (*pads, why)


def _keeps(n) -> bool:
    """An op whose removal eager would notice (side effects, random numbers drawn)."""
    tags = getattr(n.target, "tags", ())
    return n.is_impure() or torch.Tag.nondeterministic_seeded in tags


# --- rewriting --------------------------------------------------------------------------
class _Rewriter:
    """Builds the padded products in a copy of the graph (``g``), sharing each operand's
    padding between the products that read it."""

    def __init__(self, g: fx.Graph, roots: set):
        self.g = g
        self.roots = roots            # nodes whose memory a caller-visible output is
        self.memo = {}                # (node, pads) -> padded node
        self.hosts = {}               # node -> its first padded copy (other readers slice it)
        self.orphans = set()          # nodes that lost readers to the rewrite

    def node(self, target, args, kwargs=None, like=None):
        n = self.g.call_function(target, tuple(args), kwargs or {})
        meta = {k: v for k, v in like.meta.items() if k != "val"} if like is not None else {}
        n.meta.update(meta)
        n.meta["val"] = target(*fx.map_arg(tuple(args), _val), **(kwargs or {}))
        return n

    def padded(self, x: fx.Node, pads: dict, at: fx.Node) -> fx.Node:
        """``x`` with ``pads[dim]`` zeros appended along each dim (beneath the views
        ``SEE_THROUGH`` names)."""
        key = (x, tuple(sorted(pads.items())))
        if key in self.memo:
            return self.memo[key]
        v = _val(x)
        rule = SEE_THROUGH.get(x.target) if x.op == "call_function" else None
        under = rule(x, pads) if rule is not None and isinstance(_val(x.args[0]), torch.Tensor) \
            else None
        if under is not None:
            base = self.padded(x.args[0], under[0], at)
            with self.g.inserting_after(base):
                out = under[1](self, base)
        else:
            spec = []
            for d in reversed(range(v.dim())):
                spec += [0, pads.get(d, 0)]
            while spec and spec[-1] == 0 and spec[-2] == 0:
                del spec[-2:]
            computed = x.op == "call_function"
            with (self.g.inserting_after(x) if computed else self.g.inserting_before(at)):
                out = self.node(aten.constant_pad_nd.default, [x, spec, 0.0], like=x)
            if computed:
                self.hosts.setdefault(x, (out, pads))
        self.memo[key] = out
        return out

    def slice_back(self, x: fx.Node, sizes, like) -> fx.Node:
        """``x`` cut back to ``sizes`` (a view: no copy)."""
        for d, s in enumerate(sizes):
            if _val(x).shape[d] != s:
                with self.g.inserting_after(x):
                    x = self.node(aten.slice.Tensor, [x, d, 0, s], like=like)
        return x

    def product(self, node: fx.Node, pm: int, pk: int, pn: int) -> None:
        spec = OPS[node.target]
        args = list(node.args)
        nd = spec.batch + 2
        a_pads = {d: p for d, p in ((nd - 2, pm), (nd - 1, pk)) if p}
        b_pads = {d: p for d, p in ((nd - 2, pk), (nd - 1, pn)) if p}
        if a_pads:
            args[spec.mat1] = self.padded(args[spec.mat1], a_pads, node)
        if b_pads:
            args[spec.mat2] = self.padded(args[spec.mat2], b_pads, node)
        if spec.bias is not None and isinstance(args[spec.bias], fx.Node):
            args[spec.bias] = self._bias(args[spec.bias], pm, pn, node)
        out_sizes = list(_val(node).shape)
        with self.g.inserting_before(node):
            prod = self.node(node.target, args, dict(node.kwargs), like=node)
        result = self.slice_back(prod, out_sizes, node)
        if (pm or pn) and node in self.roots:
            # the caller sees it: eager's fresh contiguous tensor, not a window on a larger one
            with self.g.inserting_after(result):
                result = self.node(aten.clone.default, [result],
                                   {"memory_format": torch.contiguous_format}, like=node)
        node.replace_all_uses_with(result)
        self.orphans.update(a for a in node.all_input_nodes)
        self.g.erase_node(node)

    def _bias(self, bias: fx.Node, pm: int, pn: int, at: fx.Node) -> fx.Node:
        """The bias broadcast over the padded result: its dims of the result's full
        size padded too (a broadcast dim of size 1 stays)."""
        v = _val(bias)
        pads = {}
        if v.dim() >= 1 and pn and v.shape[-1] != 1:
            pads[v.dim() - 1] = pn
        if v.dim() >= 2 and pm and v.shape[-2] != 1:
            pads[v.dim() - 2] = pm
        return self.padded(bias, pads, at) if pads else bias

    def share_padded(self) -> None:
        """Other readers of a padded value read a slice of its padded copy, so the value
        is stored once — inside the padding kernel — not once more for them."""
        pad_nodes = set(self.memo.values())
        for x, (host, pads) in self.hosts.items():
            if eager_root(x) in self.roots:     # the caller sees its memory: left as it is
                continue
            others = [u for u in x.users if u not in pad_nodes]
            if not others:
                continue
            view = self.slice_back(host, list(_val(x).shape), x)
            for u in others:
                u.replace_input_with(x, view)

    def drop_orphans(self) -> None:
        """Remove the values only the replaced products read (the unpadded operands'
        views): lowered, a reshape of an unread value would still be stored. Values
        without readers before the pass, and impure or random ops, stay."""
        work, erased = list(self.orphans), set()
        while work:
            n = work.pop()
            if n in erased or n.users or n.op != "call_function" or _keeps(n):
                continue
            work.extend(n.all_input_nodes)
            self.g.erase_node(n)
            erased.add(n)


def _copy(gm: fx.GraphModule) -> tuple[fx.GraphModule, dict]:
    """A copy of ``gm`` (nodes' meta copied) and the map from its nodes to the copy's."""
    g, env = fx.Graph(), {}
    for n in gm.graph.nodes:
        env[n] = g.node_copy(n, lambda a: env[a])
    new = fx.GraphModule(gm, g)
    new.meta = dict(getattr(gm, "meta", {}))
    return new, env


def _to_meta(t):
    if isinstance(t, torch.Tensor) and t.device.type != "meta":
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return t


def _with_shapes(gm, example_inputs):
    """A copy of ``gm`` whose nodes record the shapes ``example_inputs`` give (a graph
    built by hand records none), or None when it cannot run on meta tensors. The
    recorded devices are dropped: the lowering records its own for such a graph."""
    new, _ = _copy(gm)

    class Recorder(fx.Interpreter):
        def run_node(self, n):
            r = super().run_node(n)
            n.meta["val"] = pytree.tree_map(_to_meta, r)
            n.meta.pop("device", None)
            return r
    try:
        with torch.no_grad():
            Recorder(new).run(*[_to_meta(t) for t in example_inputs])
    except Exception:         # noqa: BLE001  (no meta kernel, data-dependent op: left)
        return None
    return new


def pad_matmuls(gm: fx.GraphModule, example_inputs) -> tuple[fx.GraphModule, list]:
    """``gm``, or a copy with its misaligned products padded; and the log lines saying
    which were (and which were left, with why)."""
    if not enabled(example_inputs) or not any(
            n.op == "call_function" and n.target in OPS for n in gm.graph.nodes):
        return gm, []
    src = gm if _shapes_known(gm, example_inputs) else _with_shapes(gm, example_inputs)
    if src is None:
        line = "pad_mm: graph left: its shapes could not be recorded on meta tensors"
        _log.info("%s", line)
        return gm, [line]
    plans = [(n, plan_for(n)) for n in src.graph.nodes if n.op == "call_function"
             and n.target in OPS]
    plans = [(n, p) for n, p in plans if p is not None]
    notes = [f"pad_mm: {n.name}: {p[3]}" for n, p in plans if not any(p[:3])]
    for line in notes:
        _log.info("%s", line)
    todo = [(n, p) for n, p in plans if any(p[:3])]
    if not todo:
        return gm, notes
    new, env = _copy(src)
    rw = _Rewriter(new.graph, {env[r] for r in output_roots(src)})
    for n, (pm, pk, pn, why) in todo:
        rw.product(env[n], pm, pk, pn)
        line = f"pad_mm: {n.name} padded: {why}"
        _log.info("%s", line)
        notes.append(line)
    rw.drop_orphans()
    rw.share_padded()
    new.graph.lint()
    new.recompile()
    return new, notes
