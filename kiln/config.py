"""Every kiln setting, each read once from its ``KILN_*`` environment variable.

Settings are plain module attributes so that ``kiln.config.recompile_limit = 2`` works
from user code and tests; ``patch`` sets some for the length of a ``with`` block.
"""
from __future__ import annotations

import contextlib
import os
import threading


def _env_bool(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    if v is None:
        return default
    return v.strip().lower() in ("1", "true", "yes", "on")


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    return default if v is None or not v.strip() else int(v)


def _env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


# --- capture -------------------------------------------------------------------
#: How many compiled entries one code object may hold before kiln stops compiling it
#: and runs it eagerly (KILN_RECOMPILE_LIMIT).
recompile_limit: int = _env_int("KILN_RECOMPILE_LIMIT", 8)
#: Symbolic sizes (KILN_DYNAMIC_SHAPES; ``kiln.compile(dynamic=)`` sets it per function):
#: "auto" (a size that changes between calls is symbolic from the next trace on, as
#: torch's dynamic=None), "true" (every argument size symbolic from the first trace),
#: "false" (a graph per size). See kiln/shapes/policy.py.
dynamic_shapes: str = _env_str("KILN_DYNAMIC_SHAPES", "auto")
#: A graph with symbolic sizes that a backend compiles for concrete sizes (the kiln
#: kernels) compiles every size it meets and keeps this many, the least recently used
#: dropped; a stream that has cycled past it runs new sizes op by op, not compiled
#: (never one compile per call) (KILN_DYNAMIC_SPECIALIZATIONS; kiln/shapes/variants.py).
dynamic_specializations: int = _env_int("KILN_DYNAMIC_SPECIALIZATIONS", 128)
#: A later size of such a graph whose kernels need a compiler run (a new size class)
#: compiles them on a thread while its calls run the graph op by op, instead of
#: stalling the call that met it: "auto" (Triton kernels, compiled by the compile
#: workers while the GPU computes), "1" (C++ libraries too: the compiler then shares
#: the cores with the program's own loops) or "0" (KILN_BACKGROUND_SIZE_BUILDS;
#: kernels/size_prebuild.py).
background_size_builds: str = _env_str("KILN_BACKGROUND_SIZE_BUILDS", "auto")
#: Where background size builds are on (above), a size's plan (lowering, scheduling,
#: code generation: ~75 ms of Python a size for resnet18 in bf16 on an H100 host) is
#: made in a planner process, its calls op by op meanwhile (KILN_BACKGROUND_SIZE_PLANS;
#: kernels/plan_process.py; the process starts when a symbolic graph's first size
#: compiles).
background_size_plans: bool = _env_bool("KILN_BACKGROUND_SIZE_PLANS", True)
#: On an internal error while compiling, run the frame eagerly (with a warning that
#: says why) instead of raising; a graph whose kernels cannot be built or loaded (a
#: failing C++ compiler, a failing first launch) runs its aten graph eagerly
#: (KILN_SUPPRESS_ERRORS; the test suite turns it off so that kiln's own bugs fail
#: loudly).
suppress_errors: bool = _env_bool("KILN_SUPPRESS_ERRORS", True)
#: Print full internal tracebacks when compilation fails (KILN_VERBOSE).
verbose: bool = _env_bool("KILN_VERBOSE", False)
#: How deep user-function inlining may nest before the call becomes a graph break
#: (KILN_INLINE_DEPTH).
inline_depth: int = _env_int("KILN_INLINE_DEPTH", 64)
#: Upper bound on bytecode instructions interpreted for one frame, loops unrolled
#: (KILN_MAX_INSTRUCTIONS) — a runaway loop becomes a clean error, not a hang.
max_instructions: int = _env_int("KILN_MAX_INSTRUCTIONS", 2_000_000)
#: The backend ``kiln.compile`` uses when none is named (KILN_BACKEND).
default_backend: str = _env_str("KILN_BACKEND", "kiln")
#: Trace NumPy code into torch ops (KILN_TRACE_NUMPY); off, every NumPy call and
#: ndarray operation is a graph break that runs NumPy (to tell a NumPy tracing bug
#: from another).
trace_numpy: bool = _env_bool("KILN_TRACE_NUMPY", True)
#: Cut the graphs of a module compiled inside DistributedDataParallel
#: (``kiln.compile(DDP(m))``) at DDP's gradient-bucket boundaries, each piece compiled
#: as its own graph, so a bucket's all-reduce overlaps the rest of the backward; off,
#: one graph (KILN_DDP_SPLIT).
ddp_split: bool = _env_bool("KILN_DDP_SPLIT", True)
#: Regional compilation without annotation: the copies of a repeated block (transformer
#: layers) in one graph are compiled once — C++ kernels that are the same function up
#: to buffer names share one function (``kernels/codegen/cpp/shared.py``) — so a deep
#: model's cold compile stays near a shallow one's (KILN_REGIONAL).
regional: bool = _env_bool("KILN_REGIONAL", True)
#: Pause Python's cyclic garbage collector while a frame compiles: its full collections
#: walk the whole heap, the user's model included (capture/gc_pause.py) (KILN_PAUSE_GC).
pause_gc: bool = _env_bool("KILN_PAUSE_GC", True)
#: Check entries' guards in a small C++ library built once per installation: tensors'
#: dtype, device, sizes, strides and requires_grad (capture/native_guards.py), and runs
#: of guards on module types, hooks and attributes (capture/guard_program.py)
#: (KILN_NATIVE_GUARDS).
native_guards: bool = _env_bool("KILN_NATIVE_GUARDS", True)
#: Tests: evaluate each run of guards the library checks in Python too, on every call,
#: and raise where the two differ (capture/guard_program.py) (KILN_NATIVE_GUARDS_VERIFY).
native_guards_verify: bool = _env_bool("KILN_NATIVE_GUARDS_VERIFY", False)
#: Where that library is kept: kiln's own code, so not under cache_dir (KILN_NATIVE_DIR).
native_dir: str = _env_str(
    "KILN_NATIVE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "kiln-native")
)

# --- autograd ------------------------------------------------------------------
#: Recompute cheap pointwise ops in the backward rather than saving them
#: (KILN_PARTITION_RECOMPUTE).
partition_recompute: bool = _env_bool("KILN_PARTITION_RECOMPUTE", True)

# --- kernels -------------------------------------------------------------------
#: Where compiled kernels are cached between processes (KILN_CACHE_DIR); entries are
#: checked before use, and a directory that cannot be written is replaced by a
#: process-private one (kiln/disk_cache.py).
cache_dir: str = _env_str(
    "KILN_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "kiln")
)
#: Remember each traced entry (its guards, entry code and torch-level graph) on disk,
#: under cache_dir, so that a later process rebuilds it instead of tracing again
#: (KILN_CAPTURE_CACHE; kiln/capture/capture_cache.py).
capture_cache: bool = _env_bool("KILN_CAPTURE_CACHE", True)
#: Remember each graph's autograd trace (its aten graph and what the runtime needs to
#: call it) on disk, under cache_dir (KILN_TRACE_CACHE; kiln/autograd/trace_cache.py).
trace_cache: bool = _env_bool("KILN_TRACE_CACHE", True)
#: Remember each graph's lowering, schedule and generated source on disk, under
#: cache_dir, so that a second process compiling the same graph skips all of it
#: (KILN_GRAPH_CACHE).
graph_cache: bool = _env_bool("KILN_GRAPH_CACHE", True)
#: Let C++ kernels call glibc's vector math (libmvec) for sin, erf, pow, log1p… when
#: the compiler probe finds it works (kernels/toolchain/cxx_vecmath.py); off, they call
#: scalar libm (KILN_CPU_VECTOR_MATH).
cpu_vector_math: bool = _env_bool("KILN_CPU_VECTOR_MATH", True)
#: Run random ops through PyTorch so results match eager bit for bit
#: (KILN_FALLBACK_RANDOM).
fallback_random: bool = _env_bool("KILN_FALLBACK_RANDOM", False)
#: Threads of this process that compile Triton kernels beside the workers (ptxas and
#: parts of LLVM release the GIL) (KILN_COMPILE_THREADS).
compile_threads: int = _env_int("KILN_COMPILE_THREADS", min(4, os.cpu_count() or 1))
#: Worker processes that compile a graph's Triton kernels beside this one, started
#: when kiln is first called with CUDA tensors; 0: every kernel compiles in this
#: process (KILN_COMPILE_WORKERS).
compile_workers: int = _env_int("KILN_COMPILE_WORKERS", min(8, (os.cpu_count() or 1) // 2))
#: Replay compiled graphs' launches from CUDA graphs (``kernels/runtime/graph_replay.py``):
#: "auto" (graphs of >= 8 steps without random ops; one launch instead of one per
#: kernel, their memory pool held between calls), "1" (any size) or "0" (never)
#: (KILN_CUDAGRAPHS).
cudagraphs: str = _env_str("KILN_CUDAGRAPHS", "auto")
#: Recordings of one compiled graph's size variants kept at once (one per input-size
#: signature): beyond it the least recently used is dropped, and a variant dropped twice
#: makes plain launches. Recordings share one memory pool, so each costs its outputs and
#: static input buffers, not its temporaries; a replay is several times cheaper than
#: plain launches for a small batch (resnet18 bf16 at batch 2 on an H100: 0.6 against
#: 2.0 ms), so a serving stream of up to this many sizes replays every one
#: (KILN_CUDAGRAPH_MAX_RECORDINGS).
cudagraph_max_recordings: int = _env_int("KILN_CUDAGRAPH_MAX_RECORDINGS", 64)
#: Triton kernels divide a flat index by a size argument with a multiply and shift by
#: its magic number rather than a run-time integer division per element
#: (``codegen/triton/exprs.py``) (KILN_TRITON_FAST_DIVISION).
triton_fast_division: bool = _env_bool("KILN_TRITON_FAST_DIVISION", True)
#: Pointwise Triton kernels over [rows, long contiguous rows] that read values per row
#: (a row's max, its target, a 0-d scalar) run on a 2-D grid of rows by column blocks:
#: those values are loaded once per row of a program and no element recovers its row
#: and column by division (``codegen/triton/row_tiles.py``) (KILN_TRITON_ROW_TILES).
triton_row_tiles: bool = _env_bool("KILN_TRITON_ROW_TILES", True)
#: Kernels take the integers that come from sizes and strides (loop bounds, index
#: coefficients, element counts) as arguments instead of literals, so graphs that differ
#: only in sizes share one compiled C++ library or Triton module
#: (``kernels/codegen/size_args.py``) (KILN_KERNEL_SIZE_ARGS).
kernel_size_args: bool = _env_bool("KILN_KERNEL_SIZE_ARGS", True)
#: Sizes and strides up to this magnitude stay literals in kernels (a small inner dim
#: the C++ compiler unrolls; a stride of 2) (KILN_KERNEL_SIZE_ARGS_MIN).
kernel_size_args_min: int = _env_int("KILN_KERNEL_SIZE_ARGS_MIN", 16)
#: Triton kernels divide and take remainders by literal divisors, their other sizes still
#: arguments; in a symbolic graph, every divisor that no symbolic size or stride of the
#: graph equals at this size (``autograd/specialize.size_expressions``: a channel count
#: under a dynamic batch) is a literal too. A literal divisor is a multiply and shift
#: Triton derives and sees through, so its analysis keeps the index's contiguity and
#: loads and stores stay vectors (resnet18's stem kernel in bf16 at batch 64 on an H200:
#: 218 us with divisors as arguments, 91 us literal). Kernels that differ only in their
#: element counts (an optimizer's updates) still share one binary
#: (KILN_TRITON_LITERAL_DIVISORS).
triton_literal_divisors: bool = _env_bool("KILN_TRITON_LITERAL_DIVISORS", True)
#: A cheap pointwise value that several ops read, made from no more bytes than it
#: holds (float32 GELU pieces from a bfloat16 activation), is computed again inside
#: each reader's kernel instead of stored and read back (``kernels/lowering/recompute.py``)
#: (KILN_RECOMPUTE_POINTWISE).
recompute_pointwise: bool = _env_bool("KILN_RECOMPUTE_POINTWISE", True)

#: Large matrix products whose result one pointwise kernel reads become one Triton
#: kernel (matmul with that kernel as its epilogue; GPUs with TMA): "background"
#: (library call and plain kernel until the fused kernel, compiled by a worker, is
#: loaded), "sync" (compiled before its first launch) or "off" (KILN_MATMUL_EPILOGUE).
#: Off by default: on the H100 the fused Linear+GELU measured level with cuBLAS and a
#: separate GELU pass (1.82-1.86 ms each, 8192x4096 @ 4096x16384 bf16), not faster.
matmul_epilogue: str = _env_str("KILN_MATMUL_EPILOGUE", "off")

#: CPU matrix products (mm, addmm; float32/64) of at most this many multiply-adds are
#: compiled into kiln's C++ loops, fused with their bias and activation, instead of a
#: BLAS call that costs more in dispatch than the arithmetic (0: always the library)
#: (KILN_SMALL_MATMUL_MACS).
small_matmul_macs: int = _env_int("KILN_SMALL_MATMUL_MACS", 32768)

#: Matrix products (mm, addmm, bmm; bf16/fp16, fp32 under TF32) whose M, N or K is not
#: a multiple of 16 bytes run on zero-padded operands, so that cuBLAS picks its aligned
#: tensor-core kernels (kernels/pad_mm.py): "1" (graphs on CUDA), "always" (any device:
#: tests run it on the CPU) or "0" (never) (KILN_PAD_MM).
pad_mm: str = _env_str("KILN_PAD_MM", "1")
#: Products of fewer floating-point operations (2*M*N*K per batch) are not padded: the
#: copies would cost more than the aligned kernel saves (KILN_PAD_MM_MIN_FLOPS).
pad_mm_min_flops: int = _env_int("KILN_PAD_MM_MIN_FLOPS", 1 << 28)

#: Which code generator compiles kernels: "auto" (Triton for CUDA tensors, C++ for CPU
#: ones), "cpp" or "triton" — the latter on CPU tensors needs TRITON_INTERPRET=1
#: (KILN_KERNEL_TARGET).
kernel_target: str = _env_str("KILN_KERNEL_TARGET", "auto")

#: Time each compiled graph against the same aten graph run by PyTorch during its
#: first calls and keep the faster, per graph and input signature
#: (kernels/runtime/perf_fallback.py; the decisions under KILN_LOGS=perf); the test
#: suite turns it off so that which code ran does not depend on timing
#: (KILN_PERF_FALLBACK).
perf_fallback: bool = _env_bool("KILN_PERF_FALLBACK", True)
#: Timed calls of each variant before the perf fallback decides (fewer when one is
#: clearly faster) (KILN_PERF_FALLBACK_ROUNDS).
perf_fallback_rounds: int = _env_int("KILN_PERF_FALLBACK_ROUNDS", 6)

# --- debugging -----------------------------------------------------------------
#: Check a stage's graphs and, when one fails, shrink it and write a standalone
#: ``repro.py`` (kiln/debug/minifier.py): "capture" (the torch-level graph handed to
#: the backend), "autograd" (the aten graphs handed to the kernel compiler),
#: "kernels" (every graph the kernel compiler builds, its kernels run directly) or ""
#: (off) (KILN_REPRO_AFTER).
repro_after: str = _env_str("KILN_REPRO_AFTER", "")
#: What counts as a failure for the minifier: "error" (compiling or running raises)
#: or "accuracy" (also a result that differs from eager's beyond tolerance)
#: (KILN_REPRO_LEVEL).
repro_level: str = _env_str("KILN_REPRO_LEVEL", "error")
#: A deliberate bug in the kernel compiler, to test the minifier end to end:
#: "relu_compile_error" (compiling a graph with relu raises) or "relu_accuracy"
#: (relu computes relu(x) + 1); "" in normal use (KILN_INJECT_BUG).
inject_bug: str = _env_str("KILN_INJECT_BUG", "")
#: When capturing a frame fails (an internal error, or Unsupported under fullgraph),
#: write a record of it that ``python -m kiln.replay FILE`` re-runs through capture
#: (kiln/debug/replay.py) (KILN_REPLAY_RECORD).
replay_record: bool = _env_bool("KILN_REPLAY_RECORD", False)
#: A progress line on stderr (graph count and stage) during a long compile: "auto"
#: (when stderr is a terminal), "1" (always) or "0" (never) (KILN_PROGRESS).
progress: str = _env_str("KILN_PROGRESS", "auto")
#: Triton kernels of at least this many elements time several launch configurations
#: (num_warps) on first use; mode="max-autotune" lowers it so smaller kernels are
#: tuned too (KILN_AUTOTUNE_MIN_NUMEL).
autotune_min_numel: int = _env_int("KILN_AUTOTUNE_MIN_NUMEL", 1 << 24)

# --- logging -------------------------------------------------------------------
#: Comma-separated log artefacts to show, e.g. "graph_breaks,recompiles,guards"
#: (KILN_LOGS). See kiln/debug/logs.py for the list.
logs: str = _env_str("KILN_LOGS", "")
#: A directory where every compile of the process writes its artefacts (graphs, entry
#: code, aot graphs, loop IR, kernels, guards, cache hits, stage times) and one
#: self-contained ``index.html`` report, rewritten after each compile; "" for none
#: (KILN_TRACE; kiln/debug/trace_dir.py).
trace_dir: str = _env_str("KILN_TRACE", "")


def settings_key() -> str:
    """Every setting's value, as part of a cache key (where files go and what is logged
    left out: they change no result)."""
    skip = {"logs", "trace_dir", "cache_dir", "native_dir"}
    return ";".join(f"{k}={v!r}" for k, v in sorted(globals().items())
                    if not k.startswith("_") and k not in skip
                    and isinstance(v, (bool, int, float, str, tuple, type(None))))


@contextlib.contextmanager
def patch(**settings):
    """Temporarily set config values: ``with kiln.config.patch(recompile_limit=2): ...``."""
    g = globals()
    old = {}
    for k, v in settings.items():
        if k not in g or k.startswith("_"):
            raise AttributeError(f"kiln.config has no setting {k!r}")
        old[k] = g[k]
        g[k] = v
    try:
        yield
    finally:
        g.update(old)


_overlay = threading.local()


@contextlib.contextmanager
def overlay(settings: dict):
    """``patch(**settings)`` for a compiled function's call (``kiln.compile(mode=...,
    options=...)``), remembered so that ``bound`` can apply it again later."""
    outer = getattr(_overlay, "settings", None)
    _overlay.settings = {**(outer or {}), **settings}
    try:
        with patch(**settings):
            yield
    finally:
        _overlay.settings = outer


def bound(fn):
    """``fn``, to be called later (a backward graph's compile inside ``loss.backward()``),
    under the overlay of the compiled function being called now (``fn`` itself if none)."""
    settings = getattr(_overlay, "settings", None)
    if not settings:
        return fn

    def under_settings(*args, **kwargs):
        with patch(**settings):
            return fn(*args, **kwargs)

    return under_settings

