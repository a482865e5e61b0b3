"""A process that compiles Triton kernels for kiln (``triton_pool`` runs several).

Triton holds the GIL for much of a compile, so threads of one process overlap only
its ptxas runs and parts of LLVM. Separate processes compile side by side. A worker
is started as a plain script, not through the ``kiln`` package, so it never imports
torch: Python, Triton, and a one-line warm-up compile (MLIR's and LLVM's set-up) are
its whole start-up, paid while the parent process is still capturing.

Protocol, over stdin/stdout, each message a 4-byte length and a pickle: the worker
says ``{"ready": True, ...}`` once warm; then per job ``{"path", "name", "signature",
"consts", "options"}`` (a generated module's file, a kernel in it, Triton's signature,
its constexprs and compile options) it answers ``{"hash", "group", "signature",
"constants", "attrs"}`` (the compiled kernel's files in Triton's cache, enough to
rebuild its ``CompiledKernel``) or ``{"error": text}``. End of input ends it.

The functions here that need no torch (Triton's key, a compile for a named target,
the warm-up) are also what the parent process uses (``triton_setup``,
``triton_build``).
"""
from __future__ import annotations

import functools
import os
import pickle
import struct
import sys

#: Lines of a generated module that only its host code needs (not its kernels); a
#: worker executes the module with them blanked, line numbers kept for Triton.
HOST_ONLY = "# host only"


def install_stamp(stamp: str) -> None:
    """Make Triton's installation key (``triton_key``, wherever it was imported) its
    version and ``stamp`` (``triton_stamp.stamp``: its files' sizes and times)."""
    import triton
    from triton.runtime import cache as tcache
    original = tcache.triton_key
    key = f"{triton.__version__}-kiln-stamp-{stamp}"
    for name, mod in list(sys.modules.items()):
        if name.startswith("triton") and getattr(mod, "triton_key", None) is original:
            mod.triton_key = lambda: key


def gpu_target(arch: int, warp_size: int = 32):
    from triton.backends.compiler import GPUTarget
    return GPUTarget("cuda", arch, warp_size)


@functools.lru_cache(None)
def _aligned(target):
    from triton.compiler.compiler import make_backend
    return make_backend(target).parse_attr("D")


def compile_source(fn, signature: dict, consts: dict, target, options: dict):
    """Triton's CompiledKernel of the JITFunction ``fn`` for ``target``; every pointer
    parameter is taken as 16-byte aligned (what the caching allocator returns)."""
    import triton
    from triton.compiler import ASTSource
    attrs = {(i,): _aligned(target) for i, t in enumerate(signature.values())
             if t.startswith("*")}
    return triton.compile(ASTSource(fn, signature, dict(consts), attrs), target=target,
                          options=dict(options))


def read_message(f):
    head = f.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack("<I", head)
    return pickle.loads(f.read(n))


def write_message(f, msg) -> None:
    data = pickle.dumps(msg)
    f.write(struct.pack("<I", len(data)) + data)
    f.flush()


def _module(path: str, modules: dict):
    mod = modules.get(path)
    if mod is None:
        import importlib.util
        with open(path) as f:
            text = "".join("\n" if line.rstrip().endswith(HOST_ONLY) else line for line in f)
        spec = importlib.util.spec_from_file_location(f"kiln_worker_{len(modules)}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        exec(compile(text, path, "exec"), mod.__dict__)
        modules[path] = mod
    return mod


def warm_up(target) -> None:
    """Compile a one-line kernel for ``target``: Triton's first compile in a process
    also sets up MLIR and LLVM (0.1-0.5 s on the H100 machine), so a process pays it
    here, beside other work, rather than in front of its first real kernel (a worker at
    its start; kiln's own process in ``triton_setup``'s background thread). The binary
    lands in Triton's cache, so later processes find it."""
    import triton
    import triton.language as tl

    @triton.jit
    def kiln_warmup(src, dst, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(dst + i, tl.load(src + i) + 1)
    compile_source(kiln_warmup, {"src": "*fp32", "dst": "*fp32", "BLOCK": "constexpr"},
                   {"BLOCK": 128}, target, {"num_warps": 4})


def _job(msg: dict, target, modules: dict) -> dict:
    kernel = getattr(_module(msg["path"], modules), msg["name"])
    fn = kernel.fn if hasattr(kernel, "configs") else kernel   # autotuned: its JITFunction
    ck = compile_source(fn, msg["signature"], msg["consts"], target, msg["options"])
    return {"hash": ck.hash, "group": dict(ck.metadata_group),
            "signature": dict(ck.src.signature),
            "constants": dict(getattr(ck.src, "constants", {}) or {}),
            "attrs": dict(getattr(ck.src, "attrs", {}) or {})}


def serve(stamp: str, arch: int, warp_size: int) -> None:
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                        # anything printed goes to stderr, not the pipe
    inp = sys.stdin.buffer
    install_stamp(stamp)
    target = gpu_target(arch, warp_size)
    try:
        warm_up(target)
    except Exception:                    # noqa: BLE001  (the first job pays the set-up)
        pass
    write_message(out, {"ready": True, "torch_imported": "torch" in sys.modules})
    modules: dict = {}
    while (msg := read_message(inp)) is not None:
        try:
            reply = _job(msg, target, modules)
        except Exception as e:           # noqa: BLE001  (the parent compiles it itself)
            reply = {"error": f"{type(e).__name__}: {e}"}
        write_message(out, reply)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
