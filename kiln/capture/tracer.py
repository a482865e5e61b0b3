"""Tracing one frame into a compiled entry: run the root Frame, and at the end (return,
raise, or graph break) generate the entry function.

A graph break at a call or a branch in the root frame compiles the graph captured so
far, runs the unsupported step as plain Python in the entry function, and continues in
a resume function (compiled lazily by kiln in turn). A break deeper down, inside an
inlined call, restarts the trace with that call itself as the break point; the callee
then runs as its own compiled frame.
"""
from __future__ import annotations

import logging
import time
import types
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from kiln.capture import assumptions, capture_cache
from kiln.capture import values as V
from kiln.capture.autocast_state import graph_without_autocast
from kiln.capture.codegen import (EntryCodegen, build_entry, call_at, call_source, param_names,
                                  restoring_grad_mode)
from kiln.capture.errors import RestartWithBreak, SkipFrame, Unsupported, UserException
from kiln.capture.frame_access import reads_own_frame
from kiln.capture.backend_call import PINNED_INPUTS, FirstRun, compile_graph
from kiln.capture import native_guards, sym_guards
from kiln.backends_dynamic import PerSizeCompiled, wants_concrete_sizes
from kiln.capture.cells import real_cell
from kiln.capture.interpreter import Frame, ReturnSignal
from kiln.capture.opcodes_calls import decode_call
from kiln.capture.output import OutputGraph
from kiln.capture.resume import resume_code
from kiln.capture.sources import ClosureSource, LocalSource, RefSource
from kiln.capture import rule_modules  # noqa: F401  (every rule registered before a trace)
from kiln.debug.breaks import describe
from kiln.debug.logs import log_for
from kiln.shapes.variants import stream_size

_CALLS = ("CALL", "CALL_FUNCTION_EX")
_JUMPS = ("POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE", "POP_JUMP_FORWARD_IF_TRUE",
          "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_FALSE",
          "JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP")


@dataclass
class BreakInfo:
    """One graph break: why (``break_id`` in kiln/debug/breaks.py, ``reason``) and where."""
    reason: str
    user_stack: list
    break_id: str | None = None

    def __str__(self):
        return describe(self.break_id, self.reason) + "".join(f"\n    {s}" for s in self.user_stack)


@dataclass
class Entry:
    fn: object  # the generated entry function
    guards: list
    namespace: dict
    source: str
    graphs: list = field(default_factory=list)
    breaks: list = field(default_factory=list)
    #: (source, shape) of each tensor the trace read (automatic dynamic compares them)
    tensor_inputs: list = field(default_factory=list)
    #: what the capture cache stores of a traced entry (capture_cache.Rebuild)
    rebuild: object = None


class TraceContext:
    """What a compiled function passes down: backend, fullgraph, the recorder."""

    def __init__(self, backend, fullgraph, compile_callee, recorder=None):
        self.backend = backend
        self.fullgraph = fullgraph
        self.compile_callee = compile_callee  # fn -> compiled wrapper (same settings)
        self.recorder = recorder


_GENERATOR_FLAGS = 0x20 | 0x80 | 0x200  # generator, coroutine, async generator


def trace_frame(fn: types.FunctionType, code, bound_args: dict, ctx: TraceContext) -> Entry:
    if code.co_flags & _GENERATOR_FLAGS:
        raise SkipFrame("K0004", "a generator or coroutine function: a call only makes the generator "
                        "object, so it runs as it is")
    break_at = None
    first_reason = None
    for _attempt in range(32):
        try:
            return _trace_once(fn, code, bound_args, ctx, break_at, first_reason)
        except _FinishFailed as f:
            if ctx.fullgraph:
                raise Unsupported(f.reason, f.user_stack, break_id=f.break_id) from None
            raise SkipFrame(f.reason, break_id=f.break_id) from None
        except RestartWithBreak as r:
            if break_at == r.ip:
                raise SkipFrame(r.reason, break_id=r.break_id)
            if reads_own_frame(code):
                raise SkipFrame("K0030", f"graph break ({r.reason}) in a frame that reads its own Python frame "
                                "(inspect.currentframe, locals()...): a resume function would not be it")
            break_at = r.ip
            first_reason = BreakInfo(r.reason, r.user_stack, r.break_id)
    raise SkipFrame("K0049", "too many restarts")


def _trace_once(fn, code, bound_args, ctx, break_at, break_info):
    out = OutputGraph()
    out.policy = getattr(ctx, "policy", None)
    out.grad_blocks = list(getattr(fn, "_kiln_grad_blocks", ()))
    out.autocast.resume_inside(getattr(fn, "_kiln_amp_blocks", ()))
    out.root_globals = fn.__globals__
    g = out.guards
    ns = {"__G": fn.__globals__, "__closure": fn.__closure__, "__torch": torch,
          "__B": None}
    gsrc = RefSource("__G")
    frame = Frame(out, code, fn.__globals__, {}, globals_source=gsrc)
    ns["__B"] = frame.f_builtins
    for name, val in bound_args.items():
        frame.locals[name] = V.LazyArg(val, LocalSource(name))
    if code.co_freevars:
        for i, name in enumerate(code.co_freevars):
            frame.cells[name] = real_cell(out, fn.__closure__[i], ClosureSource(i, name))
    try:
        while True:
            if frame.ip == break_at:
                try:
                    return _compile_break(fn, code, frame, ctx, ns, break_info)
                except Unsupported as e:
                    raise _FinishFailed(f"graph break at {break_info.user_stack[-1] if break_info.user_stack else '?'} "
                                        f"({break_info.reason}) cannot resume: {e.reason}", break_id=e.break_id) from None
            inst = frame.insts[frame.ip]
            try:
                frame.step()
            except ReturnSignal:
                raise
            except UserException:
                raise
            except Unsupported as e:
                if ctx.fullgraph:
                    raise Unsupported(e.reason, frame_user_stack(e, frame), break_id=e.break_id) from None
                stack = frame_user_stack(e, frame)
                if getattr(e, "restart_ip", None) is not None:  # the break belongs at an earlier call
                    raise RestartWithBreak(e.restart_ip, e.reason, stack, e.break_id) from None
                if inst.opname in _CALLS or inst.opname in _JUMPS:
                    raise RestartWithBreak(inst.index, e.reason, stack, e.break_id) from None
                raise SkipFrame(f"{e.reason} (at {stack[-1] if stack else '?'})", break_id=e.break_id) from None
    except ReturnSignal as r:
        try:
            return _compile_return(fn, code, frame, ctx, ns, r.value)
        except Unsupported as e:
            raise _FinishFailed(f"cannot rebuild the return value: {e.reason}", frame.user_stack(), e.break_id) from None
    except UserException as e:
        try:
            return _compile_raise(fn, code, frame, ctx, ns, e.value)
        except Unsupported as e2:
            raise _FinishFailed(f"cannot rebuild the raised exception: {e2.reason}", frame.user_stack(), e2.break_id) from None


class _FinishFailed(Exception):
    def __init__(self, reason, user_stack=None, break_id=None):
        self.reason = reason
        self.user_stack = user_stack
        self.break_id = break_id


def frame_user_stack(e, frame):
    st = getattr(e, "_kiln_stack", None)
    return st if st else frame.user_stack()


def _wrap_arg(frame, val, name):
    from kiln.capture.builder import wrap

    return wrap(frame, val, LocalSource(name))


# --- finishing a trace -------------------------------------------------------------------
def _compile_graph(out: OutputGraph, cg: EntryCodegen, ctx: TraceContext, where: list):
    """Close the graph over the tensors the rest of the code needs; hand it to the
    backend (``where``: the user's lines, for its errors). Returns the graph call
    line(s) to put in the entry function."""
    if out.op_count() == 0 and not cg.graph_outputs:
        return []
    graph = out.graph
    graph.output(tuple(v.node for v in cg.graph_outputs))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    gm.meta = {"input_sources": [src.pretty() for src, _, _ in out.inputs]}
    example_inputs = [real for _, _, real in out.inputs]
    dynamic = sym_guards.symbolic_inputs(out)
    gm.meta[PINNED_INPUTS] = not dynamic and _pinned(out)
    if dynamic:
        sym_guards.annotate(out, gm)
    if out.op_count() == 0:
        # nothing to compute: outputs are views/aliases only created in-graph? keep as is
        pass
    log = log_for("graph")
    if log.isEnabledFor(logging.INFO):
        log.info("captured graph:\n%s", gm.print_readable(print_output=False),
                 extra={"kiln_gm": gm})
    t0 = time.perf_counter()
    if dynamic and wants_concrete_sizes(ctx.backend):
        compiled = PerSizeCompiled(ctx.backend, gm, lambda b, g, ins: compile_graph(b, g, ins, where))
        compiled._for(example_inputs, first=True)   # the backend's errors belong to this compile
    elif out.small_size_of_stream:
        # a size 0 or 1 of a stream (automatic dynamic shapes): built, and first called
        # (FirstRun below), as a later size of one: on a thread where the kernel
        # compiler does that (kernels/size_prebuild)
        with stream_size("later"):
            compiled = compile_graph(ctx.backend, gm, example_inputs, where)
    else:
        compiled = compile_graph(ctx.backend, gm, example_inputs, where)
    eager = gm.forward
    checked = not _is_method(compiled, gm, "forward")  # the eager backend's graph: no check
    on_error = out.grad_mode_on_error()
    wrappers = []
    if on_error is not None:
        compiled = restoring_grad_mode(compiled, on_error)
        eager = restoring_grad_mode(eager, on_error)
        wrappers.append(("grad", on_error))
    if out.autocast.used:   # autocast's casts are in the graph: it runs with autocast off
        compiled, eager = graph_without_autocast(compiled), graph_without_autocast(eager)
        wrappers.append(("amp", None))
    if ctx.recorder is not None:
        ctx.recorder.graphs.append(gm)
        ctx.recorder.compile_time += time.perf_counter() - t0
    name = cg.ref(compiled, "graph")
    out.compiled_graph = None if dynamic or out.small_size_of_stream else \
        capture_cache.GraphInfo(name, gm, where, tuple(wrappers))
    if checked:
        cg.ns[name] = FirstRun(compiled, eager, ctx.backend, where, cg.ns, name,
                               stream="later" if out.small_size_of_stream and not dynamic else None)
    args = ", ".join(src.expr() for src, _, _ in out.inputs)
    return out.autocast.graph_call_lines(cg, f"__o = {name}({args})"), gm


def _pinned(out) -> bool:
    """Do the entry's guards pin every input's signature (the backend need not check it
    again)? Every input a tensor whose sizes and strides were guarded as they are
    (``GuardSet.tensor`` without dynamic dims: its example value has int sizes only)."""
    return all(isinstance(real, torch.Tensor) and not any(
        isinstance(d, torch.SymInt) for d in node.meta["example_value"].shape)
        for _, node, real in out.inputs)


def _is_method(f, obj, name) -> bool:
    return getattr(f, "__self__", None) is obj and getattr(f, "__name__", None) == name


def _finish(fn, code, out, cg, ctx, tail_lines, where, break_info=None, graph=True):
    lines = []
    for check in assumptions.checks_of(out):  # validation checks: graph outputs, tested after it
        cg.need(check)
    res = _compile_graph(out, cg, ctx, where) if graph else None
    gm = None
    if res:
        call_lines, gm = res
        checked = assumptions.entry_lines(out, cg, gm, fn, code, call_lines)
        if checked is None:  # the graph cannot be re-run safely: the frame runs eagerly
            fresh = EntryCodegen(out, cg.ns)
            return _finish(fn, code, out, fresh, ctx, [f"return {fresh.ref(fn, 'eager')}({call_source(code)})"],
                           where, graph=False)
        lines += checked
    if out.grad_enabled != out.entry_grad_enabled:
        # the grad mode the traced code leaves, whatever the backend does with the
        # graph's own mode changes (aten graphs have none)
        lines.append(f"__torch._C._set_grad_enabled({out.grad_enabled})")
    lines += out.autocast.leave_lines(cg)      # the autocast state the traced code leaves
    lines += cg.reads + cg.lines
    entry_lines = lines + tail_lines
    out.guard_mutated_distinct()
    sym_guards.install(out)
    guards = list(out.guards.guards)
    ns = cg.ns
    ns.update(out.guards.consts)
    names = frozenset(ns)
    fname = code.co_name if code.co_name.isidentifier() else "__kiln_entry"
    guard_codes, waiting = native_guards.guard_codes(out.guards, ns, param_names(code))
    entry_fn, text = build_entry(code, guard_codes, entry_lines, ns, fname)
    native_guards.watch(entry_fn, waiting)
    entry_fn.__defaults__ = fn.__defaults__
    entry_fn.__kwdefaults__ = fn.__kwdefaults__
    entry = Entry(entry_fn, guards, ns, text, [gm] if gm is not None else [],
                  [break_info] if break_info else [])
    entry.tensor_inputs = [(src, tuple(real.shape)) for src, _, real in out.inputs
                           if isinstance(real, torch.Tensor)]
    entry.rebuild = capture_cache.Rebuild(
        entry_lines, fname, out.guards, names, out.compiled_graph if gm is not None else None,
        out.traced_codes, cacheable=gm is None or out.compiled_graph is not None)
    glog = log_for("guards")
    if glog.isEnabledFor(logging.INFO):
        glog.info("guards for %s (%s:%d):\n%s", code.co_name, code.co_filename, code.co_firstlineno,
                  "\n".join(f"  {gd.description}" for gd in guards))
    blog = log_for("bytecode")
    if blog.isEnabledFor(logging.INFO):
        blog.info("entry for %s:\n%s", code.co_name, text)
    return entry


def _compile_return(fn, code, frame, ctx, ns, value):
    out = frame.output
    cg = EntryCodegen(out, ns)
    cg.need(value)
    for m in cg.mutated_values():
        cg.need(m)
    # expressions are built after the graph call, so collect first, then emit
    tail = []
    cg_lines_start = len(cg.lines)
    cg.side_effects()
    ret = cg.expr(value)
    tail.append(f"return {ret}")
    lines = cg.lines[cg_lines_start:]
    cg.lines = cg.lines[:cg_lines_start]
    return _finish(fn, code, out, cg, ctx, lines + tail, frame.user_stack())


def _compile_raise(fn, code, frame, ctx, ns, exc):
    """The traced path ends in an exception: its entry runs the frame eagerly (under the
    same guards), so what escapes is eager's own exception (type, args, attributes,
    cause and context) with the user's frames and lines in its traceback, as an
    uncompiled run shows it. Nothing the graph would compute is used."""
    cg = EntryCodegen(frame.output, ns)
    return _finish(fn, code, frame.output, cg, ctx, [f"return {cg.ref(fn, 'eager')}({call_source(code)})"],
                   frame.user_stack(), graph=False)


def _grad_exits(frame, inst):
    """The grad-mode and autocast with-blocks around ``inst``, outermost first; Unsupported when a
    try block (or another context manager) encloses it: the unsupported step would run
    outside the user's handler."""

    exits = []
    for ent in frame.exc_table:
        if ent.start <= inst.offset <= ent.end:
            slot = frame.stack[ent.depth - 1] if 0 < ent.depth <= len(frame.stack) else None
            if not (isinstance(slot, V.ExitValue) and isinstance(slot.ctx, V.ContextValue)):
                raise Unsupported("K0033", "the break is inside a try block or a with-block kiln cannot re-enter")
            if slot not in exits:
                exits.append(slot)
    return exits


def _compile_break(fn, code, frame, ctx, ns, info: BreakInfo):
    out = frame.output
    inst = frame.insts[frame.ip]
    stack = list(frame.stack)
    exits = _grad_exits(frame, inst)
    grad_exits = [e for e in exits if isinstance(e.ctx, V.GradModeValue)]
    stateless = [e for e in exits if getattr(e.ctx, "stateless", False)]
    if len(exits) - len(grad_exits) - len(stateless) != len(out.autocast.blocks):
        raise Unsupported("K0033", "a graph break inside torch.autocast blocks entered in another way")
    log_for("graph_breaks").info("graph break in %s: %s", code.co_name, info)
    if ctx.recorder is not None:
        ctx.recorder.breaks.append(info)
    cg = EntryCodegen(out, ns)
    cg.continues = True  # user code runs while this entry's temporaries hold what it rebuilt
    locals_ = dict(frame.locals)  # unread arguments stay LazyArg: rebuilt from their source
    for n in code.co_cellvars:  # cells are rebuilt by the resume's MAKE_CELL from these
        cell = frame.cells.get(n)
        if isinstance(cell, V.CellValue) and cell.value is not None:
            locals_[n] = cell.value
    names = code.co_varnames + tuple(c for c in code.co_cellvars if c not in code.co_varnames)
    local_names = tuple(n for n in names if n in locals_)
    for v in stack:
        cg.need(v)
    for n in local_names:
        cg.need(locals_[n])
    for m in cg.mutated_values():
        cg.need(m)
    cg.side_effects()
    if inst.opname in _CALLS:
        lines, rest, results, targets = _native_call(frame, inst, stack, cg, ctx)
    else:
        lines, rest, results, targets = _native_jump(frame, inst, stack, cg)
    if exits:
        # inside `with torch.no_grad()` / `torch.autocast(...)`: run the step in the
        # block's state and, if it raises, leave the state as the with-statements would
        entry_mode = grad_exits[0].ctx.prev if grad_exits else out.grad_enabled
        lines = [f"__torch._C._set_grad_enabled({out.grad_enabled})", "try:"] + \
                ["    " + ln for ln in lines] + \
                ["except BaseException:", f"    __torch._C._set_grad_enabled({entry_mode})"] + \
                ["    " + ln for ln in out.autocast.unwind_lines(cg)] + ["    raise"]
    body = cg.lines
    cg.lines = []
    stack_exprs = [None if v is V.NULL else cg.expr(v) for v in rest]
    local_exprs = [cg.expr(locals_[n]) for n in local_names]
    tail = list(lines)
    # each branch: call the resume function for its target with the stack it leaves
    for cond, target_index, extra in targets:
        nulls = tuple(e is None for e in stack_exprs) + tuple(False for _ in extra)
        rcode = resume_code(code, target_index, nulls, local_names)
        rfn = types.FunctionType(rcode, fn.__globals__, rcode.co_name, None, fn.__closure__)
        rfn._kiln_grad_blocks = [e.ctx.prev for e in grad_exits]   # it starts inside them
        rfn._kiln_amp_blocks = [b.fields() for b in out.autocast.blocks]
        compiled = ctx.compile_callee(rfn)
        name = cg.ref(compiled, "resume")
        args = [e for e in stack_exprs if e is not None] + list(extra) + local_exprs
        call = f"return {name}({', '.join(args)})"
        if cond is None:
            tail.append(call)
        else:
            tail.append(f"if {cond}:")
            tail.append(f"    {call}")
    body_all = body + cg.lines  # side effects, the call's operands, then the resume's
    cg.lines = []
    return _finish(fn, code, out, cg, ctx, body_all + tail, frame.user_stack(), break_info=info)


def _native_call(frame, inst, stack, cg, ctx):
    """The call at the break point, as Python source; the callee is compiled separately
    when it is a Python function (its own frame) and run as it is otherwise."""
    if inst.opname == "CALL":
        argc = inst.arg
        operands = stack[len(stack) - argc - 2:]
        rest = stack[:len(stack) - argc - 2]
        fn_v, pos, kws = decode_call(operands, frame.kw_names)
        for v in operands:
            cg.need(v)
        fn_expr = _callee_expr(fn_v, cg, ctx)
        argtxt = [cg.expr(x) for x in pos] + [f"{k}={cg.expr(x)}" for k, x in kws.items()]
        if isinstance(fn_v, V.MethodValue) and _is_python_fn(fn_v.func):
            argtxt.insert(0, cg.expr(fn_v.self_value))
        if isinstance(fn_v, V.ModuleValue) and _module_forward_compilable(fn_v):
            argtxt.insert(0, cg.expr(fn_v))
        line = f"__r = {_at_user_line(frame, cg)}({', '.join([fn_expr] + argtxt)})"
    else:  # CALL_FUNCTION_EX
        has_kw = inst.arg & 1
        n = 3 + has_kw if len(stack) >= 3 + has_kw and stack[len(stack) - 3 - has_kw] is V.NULL else 2 + has_kw
        operands = stack[len(stack) - n:]
        rest = stack[:len(stack) - n]
        ops = [o for o in operands if o is not V.NULL]
        fn_v, args_v = ops[0], ops[1]
        for v in ops:
            cg.need(v)
        kw = f", **{cg.expr(ops[2])}" if has_kw else ""
        fn_expr = _callee_expr(fn_v, cg, ctx)
        pre = ""
        if isinstance(fn_v, V.MethodValue) and _is_python_fn(fn_v.func):
            pre = f"{cg.expr(fn_v.self_value)}, "
        if isinstance(fn_v, V.ModuleValue) and _module_forward_compilable(fn_v):
            pre = f"{cg.expr(fn_v)}, "
        line = f"__r = {_at_user_line(frame, cg)}({fn_expr}, {pre}*{cg.expr(args_v)}{kw})"
    return [line], rest, ["__r"], [(None, inst.index + 1, ["__r"])]


def _at_user_line(frame, cg):
    """The caller that makes the step run at a break show as the user's line in
    tracebacks (``codegen.call_at``)."""
    code = frame.code
    line = frame.insts[frame.ip].line or code.co_firstlineno
    return cg.ref(call_at(code.co_filename, line, code.co_name), "at")


def _is_python_fn(v):
    return isinstance(v, V.UserFunctionValue)


def _module_forward_compilable(mv):
    mod = mv.mod
    return (not mod._forward_hooks and not mod._forward_pre_hooks
            and "forward" not in mod.__dict__
            and isinstance(type(mod).forward, types.FunctionType))


def _callee_expr(fn_v, cg, ctx):
    from kiln.capture.optimizers import callee_for

    if isinstance(fn_v, V.UserFunctionValue):
        return cg.ref(ctx.compile_callee(callee_for(fn_v.fn)), "callee")
    if isinstance(fn_v, V.MethodValue) and isinstance(fn_v.func, V.UserFunctionValue):
        return cg.ref(ctx.compile_callee(callee_for(fn_v.func.fn)), "callee")
    if isinstance(fn_v, V.ModuleValue) and _module_forward_compilable(fn_v):
        return cg.ref(ctx.compile_callee(type(fn_v.mod).forward), "callee")
    return cg.expr(fn_v)


def _native_jump(frame, inst, stack, cg):
    cond_v = stack[-1]
    rest = stack[:-1]
    cg.need(cond_v)
    c = cg.expr(cond_v)
    name = inst.opname
    jump_if_true = "TRUE" in name
    keeps = name.startswith("JUMP_IF_")  # JUMP_IF_X_OR_POP keeps the value on a jump
    lines = [f"__c = {_at_user_line(frame, cg)}(bool, {c})"]
    target_cond = "__c" if jump_if_true else "not __c"
    targets = [(target_cond, inst.target, [c] if keeps else []),
               (None, inst.index + 1, [])]
    return lines, rest, [], targets
