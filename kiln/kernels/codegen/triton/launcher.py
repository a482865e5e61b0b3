"""Running a generated Triton module: the launcher of each kernel (Triton's JIT at
first, then the compiled kernel called directly through ``cuda_launch``), the
autotuning of its candidates at first launch, compiling ahead (``precompile``) and
loading a module (``load``)."""

from __future__ import annotations

import weakref
from collections import OrderedDict

import torch

from ....debug.logs import log_for
from ....debug.timing import timed
from ...toolchain import cxx_build
from .exprs import interpreting


def _hook_set(h) -> bool:
    """Triton's launch hooks: None, or (3.5+) a HookChain that may be empty."""
    if h is None:
        return False
    calls = getattr(h, "calls", None)
    return calls is None or len(calls) > 0


class Launcher:
    """Launches one kernel. The first launch goes through Triton (compiling, autotuning)
    unless ``load`` handed the kernel over compiled; later ones call the compiled kernel
    directly while the arguments' 16-byte alignment (what Triton specialises pointers
    on) is unchanged: Triton's own dispatch costs tens of microseconds of Python per
    launch. Where ``cuda_launch`` can launch a kernel it does so (no C launcher to
    build), and it also times the candidates of an autotuned kernel at its first launch.
    ``why``: reasons the direct path was not taken (diagnostics)."""

    why: dict = {}
    #: the generated module's file (what a compile worker reads a fused kernel from)
    path: str | None = None

    def __init__(self, source=None, kinfo=None, mod=None):
        # id(kernel) -> (alignment, compiled, grid, constexprs, DriverKernel | None) | None
        self.fast = {}
        self.tuned = {}         # id(kernel) -> [(compiled, DriverKernel)], one per config
        self.disabled = False
        # for triton_binaries: each kernel's compiled form, once all have one
        self.source, self.kinfo = source, kinfo
        self.names = {id(getattr(mod, k[0])): k[0] for k in kinfo} if kinfo else {}
        self.compiled = {}

    def _keep(self, key, ck):
        """Note ``ck`` as what kernel ``key`` runs (after autotuning: the winner); when
        every kernel of the module has one, keep them for later processes."""
        name = self.names.get(key)
        if name is None or name in self.compiled:
            return
        self.compiled[name] = ck
        if len(self.compiled) == len(self.names):
            from ...toolchain import triton_binaries
            triton_binaries.save(self.source, self.kinfo, self.compiled)
            self.names = {}

    def preload(self, kernel, ck, n_args, consts, drv=None):
        """Launch ``kernel`` through ``ck`` (compiled for aligned pointers; ``drv``: its
        driver launch, if any) from the first call on, without Triton's JIT."""
        names = list(getattr(kernel, "arg_names", None) or kernel.fn.arg_names)
        self.fast[id(kernel)] = ((True,) * n_args, ck, None,
                                 tuple(consts[n] for n in names[n_args:]), drv)
        self._keep(id(kernel), ck)

    def preload_candidates(self, kernel, candidates):
        """An autotuned ``kernel`` whose every config is compiled and driver-launchable
        (``candidates``: (compiled, DriverKernel) in config order): its first aligned
        launch times them and keeps the fastest."""
        self.tuned[id(kernel)] = candidates

    def _note(self, reason):
        Launcher.why[reason] = Launcher.why.get(reason, 0) + 1

    @staticmethod
    def _fastest(candidates, gx, gy, stream, ptrs):
        """The candidate with the least time for a few launches (after two warm ones),
        timed with CUDA events on the launch stream; the kernels only write their
        outputs, so running them again is harmless (as in Triton's autotuner)."""
        spans = []
        for _, drv in candidates:
            for _ in range(2):
                drv.launch(gx, gy, stream, ptrs)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                drv.launch(gx, gy, stream, ptrs)
            end.record()
            spans.append((start, end))
        end.synchronize()
        times = [a.elapsed_time(b) for a, b in spans]
        return candidates[times.index(min(times))]

    def matmul(self, kernel, spec, a, b, args) -> bool:
        """A fused matmul kernel's launch if its tier is up (``matmul_epilogue``)."""
        from . import matmul_epilogue
        return matmul_epilogue.launch(kernel, spec, a, b, args, self.path)

    def __call__(self, rt, kernel, grid, args, kw):
        key = id(kernel)
        ent = self.fast.get(key)
        if ent is not None or key in self.tuned:
            ptrs = [a.data_ptr() for a in args]
            align = tuple(p % 16 == 0 for p in ptrs)
            gx, gy = grid[0], grid[1] if len(grid) > 1 else 1
            dev = args[0].device.index if args else 0
            stream = torch._C._cuda_getCurrentRawStream(dev)
            if ent is None and all(align):
                with timed("kernels.triton_autotune"):
                    ck, drv = self._fastest(self.tuned.pop(key), gx, gy, stream, ptrs)
                ent = self.fast[key] = (align, ck, None, (), drv)
                self._keep(key, ck)
            if ent is not None and align == ent[0]:
                ck, consts, drv = ent[1], ent[3], ent[4]
                try:
                    if drv is not None:
                        drv.launch(gx, gy, stream, ptrs)
                    else:
                        ck.run(gx, gy, 1, stream, ck.function, ck.packed_metadata, None, None,
                               None, *args, *consts)
                    return
                except Exception as e:       # noqa: BLE001
                    self._note(f"direct launch failed: {type(e).__name__}: {e}")
                    self.disabled = True
                    self.fast.clear()
            else:
                self._note("alignment changed")
        if not interpreting():
            from ...toolchain import triton_setup
            triton_setup.wait_for("driver")   # Triton's JIT from here
        if key in self.fast:
            ck = kernel[grid](*args, **kw)
        else:
            with timed("kernels.triton_first_launch"):
                ck = kernel[grid](*args, **kw)
        if self.disabled or key in self.fast or interpreting():
            return
        self.fast[key] = None           # one attempt per kernel
        try:
            from triton import knobs
            if _hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook):
                self._note("launch hooks installed")
                return
            if ck is None or not hasattr(ck, "packed_metadata"):
                self._note(f"no compiled kernel returned ({type(ck).__name__})")
                return
            names = list(getattr(kernel, "arg_names", None) or kernel.fn.arg_names)
            consts = tuple(kw[n] for n in names[len(args):])
            ck.run   # initialises the handles
            from ...runtime import cuda_launch
            self.fast[key] = (tuple(a.data_ptr() % 16 == 0 for a in args), ck, grid, consts,
                              cuda_launch.prepare(ck, len(args), args[0].device.index))
            if all(a.data_ptr() % 16 == 0 for a in args):
                self._keep(key, ck)
        except Exception as e:        # an unexpected Triton version: keep its own dispatch
            self._note(f"setup failed: {type(e).__name__}: {e}")
            self.disabled = True


def precompile(mod, kinfo, path: str) -> tuple:
    """Compile every kernel of ``mod`` (the module at ``path``) now, for the device's
    target (``triton_build``; Triton's ``warmup`` where kiln cannot name the
    signature), each autotuning candidate separately, shared between the compile
    workers and this process (``triton_pool``), and load each for launching
    (``ready``). Returns (kernel name -> (CompiledKernel, DriverKernel | None) for
    kernels that are not autotuned, kernel name -> [one such pair per config] for those
    that are); failures are left to the first launch."""
    if interpreting() or not kinfo or not torch.cuda.is_available():
        return {}, {}
    from ...toolchain import triton_pool
    from ...toolchain import triton_binaries
    from ...toolchain import triton_build
    from ...toolchain import triton_setup
    from ...runtime.cuda_launch import ready
    dev = torch.cuda.current_device()
    done, tuned, jobs, specs, keys = {}, {}, [], [], []

    def place(name, i, pair):
        if i is None:
            done[name] = pair
        else:
            tuned[name][i] = pair
    for name, _, _, _, _, tune in kinfo:
        if tune:
            tuned[name] = [None] * len(getattr(mod, name).configs)
    for name, n_args, dtypes, consts, fn, opts, i, key in _candidates(mod, kinfo, dev):
        hit = _KERNELS.get(key)
        if hit is not None:               # the same kernel in an earlier module
            _KERNELS.move_to_end(key)
            stats["kernels_reused"] += 1
            place(name, i, hit)
            continue
        prepared = _PREPARED.pop(key, None)
        if prepared is not None:          # compiled on a thread (``prepare``): load it
            try:
                hit = _KERNELS[key] = ready(prepared, n_args, dev)
                stats["kernels_prepared"] += 1
                place(name, i, hit)
                continue
            except Exception:             # noqa: BLE001  (compiled again below)
                pass
        jobs.append((name, n_args, dtypes, consts, fn, opts, i))
        keys.append(key)
        specs.append(_worker_job(path, name, fn, dtypes, consts, opts))

    def keep(k, compiled):
        name, n_args, *_, i = jobs[k]
        compiled = ready(compiled, n_args, dev)
        place(name, i, compiled)
        _KERNELS[keys[k]] = compiled
        while len(_KERNELS) > KERNELS_KEPT:
            _KERNELS.popitem(last=False)

    def local(k):
        name, n_args, dtypes, consts, fn, opts, i = jobs[k]
        try:
            triton_setup.wait_for("warmup")     # LLVM's one-time set-up, done meanwhile
            compiled = triton_build.compile_kernel(fn, dtypes, consts, opts)
            if compiled is None:          # through the JIT, which needs Triton's driver
                triton_setup.wait_for("driver")
                compiled = fn.warmup(*dtypes, grid=(1,), **dict(consts), **opts)
            keep(k, compiled)
        except Exception:         # noqa: BLE001  (compiled at its first launch instead)
            pass
    with timed("kernels.triton_compile"):    # (Triton's own set-up: triton_setup)
        torch.cuda.set_device(dev)
        replies = triton_pool.run(specs, local)
        for k, reply in enumerate(replies):
            if reply is not None:
                try:
                    keep(k, triton_binaries.compiled_kernel(reply, jobs[k][4].arg_names))
                except Exception:     # noqa: BLE001  (compiled at its first launch instead)
                    pass
    return done, {n: c for n, c in tuned.items() if all(x is not None for x in c)}


def _candidates(mod, kinfo, device):
    """Each compile of ``mod``'s kernels (``kinfo``): (kernel name, its argument count,
    dtypes, constexprs, the function compiled, its options, the autotuning config's
    index or None, ``kernel_key``). An autotuned kernel compiles once per config, with
    the options its autotuner will pass."""
    for name, params, dtypes, consts, nw, tune in kinfo:
        kernel = getattr(mod, name)
        if tune:
            cands = [(kernel.fn, cfg.all_kwargs(), i) for i, cfg in enumerate(kernel.configs)]
        else:
            cands = [(kernel, {"num_warps": nw}, None)]
        for fn, opts, i in cands:
            yield (name, len(params), dtypes, consts, fn, opts, i,
                   kernel_key(fn, dtypes, consts, opts, device))


def _worker_job(path: str, name: str, fn, dtypes, consts, opts) -> dict | None:
    """A compile worker's job (``triton_pool``) for one of ``_candidates``, or None
    where kiln cannot name its signature (only Triton's JIT compiles it)."""
    from ...toolchain import triton_build
    sig = triton_build.signature(fn, dtypes, consts)
    if sig is None:
        return None
    return {"path": path, "name": name, "signature": sig, "consts": dict(consts),
            "options": opts}


def needs_compiler(source: str, kinfo) -> bool:
    """Would loading ``source``'s module compile kernels? Not when a live graph loaded
    it, nor when its binaries are kept on disk (``triton_binaries``); a module whose
    kernels all compiled for other modules says yes (``prepare`` then finds them)."""
    if interpreting() or not kinfo or not torch.cuda.is_available() or source in _LOADED:
        return False
    from ...toolchain import triton_binaries
    return not triton_binaries.kept(source, kinfo)


def import_module(source: str) -> tuple:
    """(module, path): ``source``'s module imported now and kept for its load
    (``_load_module`` takes it from ``_IMPORTED``). For a background compile
    (``kernels/size_prebuild``), whose thread needs the module's kernels: importing
    is Python work (the module's code, Triton's decorator reading each kernel's
    source), and on the thread it would hold the GIL the calling thread runs the
    program with."""
    with timed("kernels.triton_module"):
        found = _IMPORTED[source] = cxx_build.load_module("triton", source)
    while len(_IMPORTED) > IMPORTED_KEPT:
        _IMPORTED.popitem(last=False)
    return found


#: modules imported ahead of their load (``import_module``), by source text
_IMPORTED: OrderedDict = OrderedDict()
IMPORTED_KEPT = 64


def prepare(source: str, kinfo, device: int, module: tuple | None = None) -> None:
    """Compile, without loading, the kernels of ``source``'s module this process has
    not compiled, into ``_PREPARED`` (``precompile`` loads them from there). For a
    thread (``kernels/size_prebuild``): it makes no CUDA call, and leaves the
    compiles to the workers when there are any, compiling here only what they fail.
    ``module``: (module, path), imported already (``import_module``)."""
    if interpreting() or not kinfo:
        return
    from ...toolchain import triton_binaries
    from ...toolchain import triton_build
    from ...toolchain import triton_pool
    mod, path = module if module is not None else import_module(source)
    jobs, keys, specs = [], [], []
    for name, _, dtypes, consts, fn, opts, _, key in _candidates(mod, kinfo, device):
        job = _worker_job(path, name, fn, dtypes, consts, opts)
        if key in _KERNELS or key in _PREPARED or key in keys or job is None:
            continue                      # compiled, or only the JIT can (at its launch)
        jobs.append((fn, dtypes, consts, opts))
        keys.append(key)
        specs.append(job)

    def local(k):
        fn, dtypes, consts, opts = jobs[k]
        try:
            _prepared(keys[k], triton_build.compile_kernel(fn, dtypes, consts, opts))
        except Exception:         # noqa: BLE001  (compiled at the build instead)
            pass
    with timed("kernels.triton_compile_background"):
        replies = triton_pool.run(specs, local, steal=False)
    for k, reply in enumerate(replies):
        if reply is not None:
            try:
                _prepared(keys[k], triton_binaries.compiled_kernel(reply, jobs[k][0].arg_names))
            except Exception:     # noqa: BLE001  (compiled at the build instead)
                pass


def _prepared(key, compiled) -> None:
    if compiled is not None:
        _PREPARED[key] = compiled
        while len(_PREPARED) > KERNELS_KEPT:
            _PREPARED.popitem(last=False)


#: kernels compiled on a thread and not yet loaded (``prepare``), by ``kernel_key``
_PREPARED: OrderedDict = OrderedDict()
#: compiled kernels of this process by content (``kernel_key``), ready to launch: a
#: module whose text differs from an earlier one's (another size class of one graph,
#: where a few kernels changed their blocks) compiles only the kernels that changed.
#: Triton's own cache key counts the kernel's line in its module, so a kernel unchanged
#: but moved (an earlier kernel grew a line) would compile again there.
_KERNELS: OrderedDict = OrderedDict()
#: the most kept, least recently used dropped
KERNELS_KEPT = 4096


def kernel_key(fn, dtypes, consts, opts, device) -> tuple:
    """A kernel's identity for ``_KERNELS``: its source text (name included: the binary
    names its entry), argument dtypes, constexprs, compile options and device. The
    helpers it calls come from kiln's prelude, the same text in every module of a
    process."""
    src = getattr(fn, "src", None) or fn._src
    return (src, tuple(str(d) for d in dtypes), tuple(sorted(dict(consts).items())),
            tuple(sorted(opts.items())), device)


#: loaded modules by source text, while a compiled graph's steps use them: a graph that
#: differs from an earlier one only in sizes (``size_args``) has the same module text, and
#: runs the same module, launcher and compiled kernels with its own grids and sizes
_LOADED = weakref.WeakValueDictionary()
stats = {"loaded": 0, "reused": 0, "kernels_reused": 0, "kernels_prepared": 0}
_code_log = log_for("output_code")


class _Module:
    """A loaded module and its launcher (what ``_LOADED`` keeps while steps hold it)."""

    def __init__(self, mod, launch):
        self.mod, self.launch = mod, launch


def load(source: str, entries, kinfo=None, sizes=None, device=None):
    """One step callable per segment, launching with ``sizes`` (``size_args.SizeArgs``:
    grids and size arguments) on ``device``; the module imported from the cache
    directory and its kernels compiled, unless a graph still alive loaded the same
    source."""
    from ..size_args import SizeArgs
    sizes = sizes or SizeArgs()
    m = _LOADED.get(source)
    if m is None:
        m = _LOADED[source] = _Module(*_load_module(source, kinfo))
        stats["loaded"] += 1
    else:
        stats["reused"] += 1
        _code_log.info("kernels: Triton module reused for new sizes (%s)",
                       ", ".join(f"ks{i}={v}" for i, v in enumerate(sizes.values)) or "none")
    mod, launch = m.mod, m.launch
    grids, host = tuple(sizes.grids), tuple(sizes.values)
    views = device_sizes(sizes, device)
    steps = []
    for name, params in entries:
        fn = getattr(mod, name)

        def step(rt, tensors, fn=fn, params=params):
            fn(rt, launch, grids, host, views, *[tensors[p] for p in params])
        step.params = params
        step.module = m           # keeps the module loaded while this step lives
        step.size_views = views   # (tests: the device array each launch reads)
        steps.append(step)
    return steps


def device_sizes(sizes, device) -> tuple:
    """Per launch (``K[j]``) a view of one int64 device array at that launch's sizes
    (``SizeArgs.slots``), None for a kernel without sizes. Made once per load: a
    launch passes its view's pointer like any tensor's, and a CUDA graph captured
    over the launches keeps reading the same addresses."""
    ks = torch.tensor(list(sizes.device) or [0], dtype=torch.int64, device=device)
    views = {}
    for slot in sizes.slots:
        if slot is not None and slot not in views:
            views[slot] = ks[slot[0]:slot[0] + slot[1]]
    return tuple(None if slot is None else views[slot] for slot in sizes.slots)


def _load_module(source: str, kinfo):
    """(module, Launcher): the module imported, its kernels compiled or loaded."""
    with timed("kernels.triton_setup"):      # once per process; mostly done meanwhile
        import triton  # noqa: F401
        from ...toolchain import triton_setup
        if interpreting() or not torch.cuda.is_available():
            triton_setup.install()
        else:
            triton_setup.wait()
    found = _IMPORTED.pop(source, None)
    if found is None:
        with timed("kernels.triton_module"):
            found = cxx_build.load_module("triton", source)
    mod, path = found
    launch = Launcher()
    if kinfo and not interpreting() and torch.cuda.is_available():
        from ...toolchain import triton_binaries
        with timed("kernels.triton_load"):
            ready_ = triton_binaries.load(source, kinfo, torch.cuda.current_device())
        tuned = {}
        if ready_ is None:
            launch = Launcher(source, kinfo, mod)
            ready_, tuned = precompile(mod, kinfo, path)
        for name, params, _, consts, _, _ in kinfo:
            if name in ready_:
                ck, drv = ready_[name]
                launch.preload(getattr(mod, name), ck, len(params), consts, drv)
            elif name in tuned and all(drv is not None for _, drv in tuned[name]):
                launch.preload_candidates(getattr(mod, name), tuned[name])
    launch.path = path
    return mod, launch
