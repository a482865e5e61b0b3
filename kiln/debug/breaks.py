"""The registry of graph-break and eager-fallback reasons: one stable ID per meaning.

Every place kiln gives up on compiling something (a graph break, a frame or graph run
eagerly) names one of these IDs, so a user can look a reason up (``docs/breaks.md``, made
from this table by ``python -m kiln.debug.breaks --write``), search for it, and count it
(``kiln.CompileProfiler``). The raise site keeps its own message, which says what exactly
was met; the registry adds what the ID means in general and what to change.

IDs are never reused nor renumbered: a reason that goes away keeps its row (marked
``retired``) so old logs still resolve. A new reason takes the next free number.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass

#: The hint of reasons no change in the user's code avoids (other than moving the code
#: out of the compiled region).
LIMITATION = "a kiln limitation: the code runs eagerly there, with eager's exact results"

_ID = re.compile(r"K\d{4}\Z")


@dataclass(frozen=True)
class Break:
    title: str
    explanation: str
    hint: str
    kind: str = "graph break"     # or "frame runs eagerly", "graph runs eagerly", "op runs as an aten call"
    retired: bool = False


def _b(title, explanation, hint=LIMITATION, kind="graph break"):
    return Break(title, explanation, hint, kind)


_FRAME = "frame runs eagerly"
_GRAPH = "graph runs eagerly"
_OP = "op runs as an aten call"

BREAKS: dict[str, Break] = {
    # --- capture: the interpreter itself ---------------------------------------
    "K0001": _b("unsupported bytecode",
                "The frame uses a Python instruction (or intrinsic) kiln's interpreter does not model."),
    "K0002": _b("too many instructions",
                "Tracing ran past config.max_instructions; usually an unbounded Python loop.",
                "bound the loop, move it out of the compiled function, or raise KILN_MAX_INSTRUCTIONS"),
    "K0003": _b("inlining too deep",
                "Calls nest deeper than config.inline_depth while being inlined.",
                "flatten the recursion, or raise KILN_INLINE_DEPTH"),
    "K0004": _b("generator or coroutine frame",
                "A generator, coroutine or async function cannot be split at a break: "
                "calling it only makes the generator object.",
                "compile the function that consumes the generator instead"),
    "K0005": _b("generator operation",
                "An operation on an inlined generator (throw, close, send, yield from, "
                "an attribute, a generator live at a break) kiln does not model."),
    "K0006": _b("data-dependent control flow",
                "A Python branch, `not`, `in`, min/max... decides on a tensor's values, "
                "which are not known while tracing.",
                "use torch.where / masking instead of a Python branch, or move the decision out"),
    "K0007": _b("tensor data needed",
                "The code reads a tensor's data into Python (.item(), .tolist(), int(), "
                "str(), formatting, storage_offset), which tracing does not have.",
                "keep the value a tensor (avoid .item()/int()/print of tensors) in compiled code"),
    "K0008": _b("op fails on fake tensors",
                "A PyTorch op cannot run on the meta/fake tensors kiln traces with "
                "(no meta kernel, a data-dependent output shape, or an error only eager can judge)."),
    "K0009": _b("attribute kiln does not model",
                "Reading an attribute of a value (a function, builtin, context manager, "
                "generator, tensor...) that kiln does not track."),
    "K0010": _b("calling an unknown value",
                "The code calls something kiln cannot call symbolically."),
    "K0011": _b("value not constant",
                "kiln must know this value while compiling (arguments of a folded call, "
                "slice bounds, options, dict keys) but it is computed or may change.",
                "pass Python constants there, or compute the value outside the compiled function"),
    "K0012": _b("truth or iteration of an object",
                "Truth value, iteration or ** unpacking of an object whose behaviour kiln does not model."),
    "K0013": _b("unknown type",
                "kiln does not know the Python type of a value it must reason about."),
    "K0014": _b("operator on these operands",
                "A Python operator (arithmetic, comparison, subscript, item assignment...) "
                "on operand types kiln does not model."),
    "K0015": _b("method implemented in C",
                "A method or dunder of a user object's class is implemented in C; kiln "
                "cannot trace into it."),
    "K0016": _b("builtin not traceable",
                "A call to a Python builtin (or these arguments of it) that kiln does not model."),
    "K0017": _b("identity of a traced value",
                "id(), hash() by identity or `is` between values whose identity is not known while tracing."),
    "K0018": _b("side effect outside the graph",
                "print() or a logging call whose message is built from traced values.",
                "log outside the compiled function, or log only constants"),
    "K0019": _b("container method",
                "A method of a list, tuple, dict, set, dict view, iterator or os.environ "
                "that kiln does not model."),
    "K0020": _b("dict changed while iterated",
                "A dict was changed while an iterator over it is live."),
    "K0021": _b("cannot rebuild a value",
                "After the graph, kiln must rebuild a Python value (a closure, super(), an "
                "iterator, a changed object) in the real program, and cannot."),
    "K0022": _b("cannot replay a side effect",
                "A change to a Python object made while tracing cannot be applied after the graph."),
    "K0023": _b("nn.Module created inside",
                "An nn.Module constructed inside the compiled region makes parameters or "
                "buffers, has its own attribute protocol, or outlives the graph.",
                "create modules outside the compiled function and pass them in"),
    "K0024": _b("constructing a class",
                "Instantiating a user class kiln cannot model (custom __new__, a metaclass, "
                "C __init__, abstract, keyword arguments, dataclass defaults, properties)."),
    "K0025": _b("attribute write kiln cannot replay",
                "Setting or deleting an attribute (of a tensor, an object with __setattr__, "
                "a module parameter, an object kiln cannot re-read), or reading obj.__dict__."),
    "K0026": _b("value kiln cannot re-read",
                "A value (tensor, closure cell, global of another module) has no source "
                "kiln can read again at run time, so it cannot be guarded or written back."),
    "K0027": _b("kiln.graph_break()",
                "The program asked for a graph break.",
                "remove the kiln.graph_break() call if the break is not wanted"),
    "K0028": _b("kiln.disable'd function",
                "The callee is marked kiln.disable, so it runs as plain Python.",
                "remove the kiln.disable marker to compile it"),
    "K0029": _b("disallowed in graph",
                "The callee was registered with kiln.disallow_in_graph.",
                "undo the disallow_in_graph registration to trace it"),
    "K0030": _b("frame reads itself",
                "The code reads its own Python frame (inspect.currentframe, locals(), "
                "sys._getframe...), which kiln's compiled code does not have.",
                "pass the values explicitly instead of reading the frame"),
    "K0031": _b("exception kiln cannot model",
                "Raising, re-raising or handling an exception in a way kiln does not model "
                "(an op's error on fake tensors handled by the program, exception attributes)."),
    "K0032": _b("unknown context manager",
                "A with-statement over a context manager kiln does not model."),
    "K0033": _b("break in a block kiln cannot re-enter",
                "The break is inside a try block or a with-block that the resume function cannot re-enter.",
                "move the unsupported call out of the try/with block"),
    "K0034": _b("autocast kiln does not model",
                "torch.autocast on another device, a nested block left out of order, or an "
                "op whose autocast behaviour is not a cast of its arguments."),
    "K0035": _b("torch.func body",
                "The function given to a torch.func transform does something the transform "
                "could not replay (changes state, writes inputs, leaks tensors, raises)."),
    "K0036": _b("torch.func options",
                "A torch.func transform (grad, vmap, jacrev...) called with options or "
                "arguments kiln does not model."),
    "K0037": _b("functional_call",
                "torch.func.functional_call used in a way kiln does not model."),
    "K0038": _b("nn.Module feature",
                "A module method, global module hooks or hooks with kwargs."),
    "K0039": _b("autograd state of a tensor",
                "Reading grad_fn or .grad, requires_grad_(), requires_grad=... or assigning .grad "
                "in a way the graph cannot express.",
                "set requires_grad and .grad outside the compiled function"),
    "K0040": _b("torch function with global effect",
                "A torch function changes global state or needs data (e.g. seeding, printing options)."),
    "K0041": _b("Tensor.type()",
                "Tensor.type() with arguments or on a device kiln does not map to a type string.",
                "use .dtype / .to(dtype) instead"),
    "K0042": _b("op arguments or results",
                "A PyTorch op called with an argument kind kiln cannot put in a graph, "
                "or returning a structure of tensors kiln does not model."),
    "K0043": _b("optimizer kernel",
                "A fused optimizer or GradScaler kernel writes lists of tensors in place; "
                "it runs eagerly.",
                "use fused=False / foreach to trace the step, or accept the break"),
    "K0044": _b("super() / descriptor",
                "super() lookups or function.__get__ kiln cannot resolve."),
    "K0045": _b("autograd.Function arguments",
                "An autograd.Function applied to arguments that are neither tensors nor constants."),
    "K0046": _b("tensor-keyed dict",
                "A dict keyed by tensors used in a way that reads tensor identity kiln cannot re-read."),
    "K0047": _b("export: several graphs",
                "kiln.export needs exactly one graph, and the function breaks into several.",
                "remove the graph breaks (see kiln.explain)"),
    "K0048": _b("cannot build a resume function",
                "After a break, kiln cannot build the function that resumes the frame here."),
    "K0049": _b("too many restarts",
                "Tracing restarted at new break points too many times; the frame runs eagerly.",
                kind=_FRAME),
    "K0050": _b("TorchFunctionMode active",
                "A TorchFunctionMode is active: compiled code would bypass it.",
                "leave the mode before calling the compiled function", kind=_FRAME),
    "K0051": _b("TorchDispatchMode active",
                "A TorchDispatchMode is active: compiled kernels would bypass it.",
                "leave the mode before calling the compiled function", kind=_FRAME),
    "K0052": _b("inside a functorch transform",
                "The compiled function is called inside vmap/grad run eagerly; kiln does not trace that.",
                "compile the whole transformed function instead", kind=_FRAME),
    "K0053": _b("recompile limit",
                "The function was compiled config.recompile_limit times; it runs eagerly from now on.",
                "make the varying inputs stable (see KILN_LOGS=recompiles), or raise KILN_RECOMPILE_LIMIT",
                kind=_FRAME),
    "K0054": _b("kiln failed",
                "kiln raised an internal error while compiling; with suppress_errors the frame runs eagerly.",
                "a kiln bug: please report it (KILN_SUPPRESS_ERRORS=0 shows the error)", kind=_FRAME),
    "K0055": _b("backend failed",
                "The backend raised while compiling a captured graph, or its compiled graph "
                "raised at its first run where the graph run eagerly does not; with "
                "suppress_errors that code runs eagerly.",
                "fix or report the backend (KILN_SUPPRESS_ERRORS=0 raises BackendCompilerFailed)",
                kind=_FRAME),
    "K0056": _b("tensor kind not modelled",
                "A sparse, quantized or nested tensor (or another layout) met while tracing; "
                "kiln's fake tensors do not model it.",
                "keep such tensors out of the compiled function, or convert them (to_dense) first"),
    "K0057": _b("control-flow operator",
                "torch.cond or torch.while_loop used in a way kiln does not model: a branch or "
                "body with Python side effects, writing its inputs, returning an input (eager "
                "raises), or outputs whose structure or metadata differ."),
    "K0058": _b("weak reference whose referent may be dead",
                "Calling a weak reference made inside the compiled region whose referent no "
                "local, stack slot or object the trace tracks holds: whether it is still alive "
                "depends on reference counts and the cycle collector."),
    # --- autograd: what the ahead-of-time tracer cannot express ---------------------
    "K0101": _b("in-place op changes storage or size",
                "An in-place op gives a tensor another storage or size (resize_, set_).", kind=_GRAPH),
    "K0102": _b("mutating op without a functional twin",
                "A mutating aten op has no out-of-place equivalent to functionalize it with.", kind=_GRAPH),
    "K0103": _b("in-place write with grad off",
                "An input that requires grad is written in place with grad mode off.", kind=_GRAPH),
    "K0104": _b("in-place write to overlapping memory",
                "An in-place op writes a tensor whose elements share memory or overlap an argument.",
                kind=_GRAPH),
    "K0105": _b("in-place write changes dtype or shape",
                "An in-place write would give the tensor another dtype or shape.", kind=_GRAPH),
    "K0106": _b("write through a view kiln cannot invert",
                "A write through a view with no inverse (or as_strided of a written tensor) "
                "into a base whose layout the functional graph does not keep.", kind=_GRAPH),
    "K0107": _b("input requiring grad written after a geometry change",
                "An input that requires grad is written in place after an in-place change of its geometry.",
                kind=_GRAPH),
    "K0108": _b("untracked tensor",
                "An op met a tensor the ahead-of-time tracer did not see created.", kind=_GRAPH),
    "K0109": _b("tensor value needed while tracing",
                "The graph needs a tensor's value (.item(), a data-dependent branch) while the "
                "autograd stage traces on meta tensors.", kind=_GRAPH),
    "K0110": _b("graph moves tensors to meta",
                "The graph moves tensors to the meta device, which tracing itself runs on.", kind=_GRAPH),
    "K0111": _b("backward only eager can run",
                "The backward reads a tensor the forward changed in place, reaches a tensor "
                "whose shape changed in place with grad off, or a backward formula is "
                "missing; eager reports it when (and if) the backward runs.", kind=_GRAPH),
    "K0112": _b("inputs share storage with a mutated input",
                "Inputs share storage with an input the graph mutates in place, in a way the compiled graph does not model.",
                "pass separate tensors (clone) where an input is written in place", kind=_GRAPH),
    "K0113": _b("input does not start its storage",
                "The graph addresses the storage of an input that does not start at its "
                "storage's beginning (as_strided on a view).", kind=_GRAPH),
    "K0114": _b("control flow on data",
                "A torch.cond whose operands need gradients, or a torch.while_loop: its path "
                "depends on data the meta-tensor trace does not have; the torch-level graph runs "
                "the operator on real tensors.", kind=_GRAPH),
    "K0115": _b("in-place view op on symbolic sizes",
                "squeeze_ on a tensor of symbolic sizes that requires grad: the trace can "
                "give it the new geometry only without the op's own backward.", kind=_GRAPH),
    # --- kernels --------------------------------------------------------------------
    # --- capture: NumPy (numpy_*.py) ------------------------------------------------
    "K0301": _b("NumPy call kiln does not trace",
                "A NumPy function, ufunc, ndarray method or attribute kiln has no rule for, or "
                "one called with options its rule does not model (out=, where=, order=, a "
                "data-dependent output shape...); NumPy runs it at the break.",
                "use a traced equivalent (docs/architecture.md lists the families), or leave "
                "this step outside the compiled function"),
    "K0302": _b("ndarray kiln cannot take",
                "An array kiln cannot read as a tensor: an ndarray subclass, a dtype torch has "
                "no counterpart for (object, string, datetime, uint16/32/64, float128, "
                "non-native byte order), negative or misaligned strides, or a constant array "
                "too large to hold in a graph.",
                "convert it (np.ascontiguousarray, .astype) before the compiled call"),
    "K0303": _b("NumPy view torch cannot make",
                "np.flip and slices with a negative step are views with negative strides in "
                "NumPy; torch tensors have none, and a copy would miss writes through either alias."),
    "K0304": _b("NumPy raises here",
                "NumPy raises for this operation (a write into a read-only array, a Python int "
                "out of the array's range, an axis out of bounds, an empty reduction, a cast "
                "same_kind refuses...); the step runs in NumPy, which raises its own error.",
                "fix the NumPy error the eager run reports"),
    "K0305": _b("np.random call kiln cannot replay",
                "np.random draws are made by the entry code with NumPy's own generator, which "
                "needs constant arguments and a size= (an array result); a Generator object is "
                "not modelled.",
                "pass size= and constant arguments, or draw outside the compiled function"),
    "K0306": _b("NumPy mixed with torch",
                "An ndarray met a torch.Tensor (an operator, a NumPy function given a tensor), "
                "Tensor.numpy() of a tensor eager refuses (requiring grad, not on the CPU), or "
                "torch.from_numpy of an array the trace keeps on the GPU.",
                "convert explicitly (t.numpy(), torch.from_numpy) where eager can, or use kiln.wrap_numpy"),
    "K0201": _b("kernels could not be built",
                "Lowering, code generation, the C++/Triton compiler or loading failed; the "
                "graph runs with PyTorch op by op.",
                "a kiln bug or a toolchain problem: KILN_SUPPRESS_ERRORS=0 shows the error", kind=_GRAPH),
    "K0202": _b("kernels failed at their first call",
                "The built kernels raised at their first call where eager does not; the graph "
                "runs with PyTorch op by op.",
                "a kiln bug or a toolchain problem: KILN_SUPPRESS_ERRORS=0 shows the error", kind=_GRAPH),
    "K0203": _b("graph called on meta tensors",
                "A kernel graph called on meta tensors has no data to compute; it runs op by op.",
                kind=_GRAPH),
    # --- kernels: one op of a compiled graph left to its aten implementation --------
    "K0204": _b("no lowering",
                "The kernel compiler has no lowering for this aten op; it runs as a library "
                "call between the generated kernels.", "a kiln limitation (performance only)", kind=_OP),
    "K0205": _b("lowering declined",
                "The op's lowering does not handle these arguments (rank, dtype, device, "
                "options); the op runs as a library call.", "a kiln limitation (performance only)",
                kind=_OP),
    "K0206": _b("empty tensor",
                "An empty input or output (a launch of zero programs, an empty reduction); "
                "the op runs as a library call.", "a kiln limitation (performance only)", kind=_OP),
    "K0207": _b("op that raises in eager",
                "For these arguments eager raises (integer division by zero, negative integer "
                "powers); the aten op runs and raises as eager does.",
                "check the divisor / exponent: eager raises here too", kind=_OP),
    "K0208": _b("Triton atomics dtype",
                "A scatter-add would need atomics Triton lacks for this dtype; the op runs as a library call.",
                "a kiln limitation (performance only)", kind=_OP),
    "K0209": _b("libdevice under the Triton interpreter",
                "The op needs libdevice math, absent from Triton's interpreter (TRITON_INTERPRET=1).",
                "a kiln limitation of interpreter runs only", kind=_OP),
    "K0210": _b("storage layout",
                "The op addresses storage (a view into a larger storage, gaps, a graph input's "
                "storage) the kernel compiler does not reproduce; the op runs as a library call.",
                "a kiln limitation (performance only)", kind=_OP),
    "K0211": _b("left to the library",
                "The op is better served by the library call (a large matmul, a convolution) "
                "than by a generated kernel.", "none needed", kind=_OP),
    "K0212": _b("window too large to unroll",
                "A pooling window too large to unroll into a kernel; the op runs as a library call.",
                "a kiln limitation (performance only)", kind=_OP),
}


def is_break_id(x) -> bool:
    return isinstance(x, str) and _ID.match(x) is not None


def split_id(args: tuple) -> tuple[str | None, tuple]:
    """(ID, the other arguments) of a reason's constructor arguments, whose first may be
    the ID: ``Unsupported("K0042", "why")`` keeps each raise site to one line."""
    if args and is_break_id(args[0]):
        return args[0], args[1:]
    return None, args


def tag(break_id: str | None, reason: str) -> str:
    """``[K0042] reason``: the form logs, errors and reports show."""
    return f"[{break_id}] {reason}" if break_id else reason


def hint(break_id: str | None) -> str | None:
    b = BREAKS.get(break_id) if break_id else None
    return b.hint if b else None


def describe(break_id: str | None, reason: str) -> str:
    """The tagged reason and, on the next line, the registry's hint."""
    h = hint(break_id)
    return tag(break_id, reason) + (f"\n  hint: {h}" if h else "")


def markdown() -> str:
    """The text of docs/breaks.md."""
    lines = ["# Graph-break and fallback reasons",
             "",
             "Every graph break, frame run eagerly and graph run eagerly names one of these IDs",
             "(`[K0042] ...` in logs, `kiln.explain`, `fullgraph=True` errors, fallback warnings and",
             "`kiln.CompileProfiler().report()`). Generated from `kiln/debug/breaks.py` by",
             "`python -m kiln.debug.breaks --write`; do not edit by hand.",
             "",
             "| ID | reason | what happens | explanation | what to do |",
             "|----|--------|--------------|-------------|------------|"]
    for k, b in sorted(BREAKS.items()):
        title = f"~~{b.title}~~ (retired)" if b.retired else b.title
        cells = [k, title, b.kind, b.explanation, b.hint]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    import pathlib

    argv = sys.argv[1:] if argv is None else argv
    text = markdown()
    if "--write" in argv:
        path = pathlib.Path(__file__).resolve().parents[2] / "docs" / "breaks.md"
        path.write_text(text)
        print(f"wrote {path}")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
