"""Library matrix products with their pointwise consumer fused in (Triton; TMA GPUs).

A Linear layer's result is mostly read once, by one pointwise kernel (an activation, a
residual add): cuBLAS writes it to memory and that kernel reads it back. For a large
``mm``/``addmm`` whose only reader is one pointwise group, the scheduler (``matmul_fusion.fuse``)
moves the product into that group (``Group.matmul``); its Triton code (``source``) is
then a persistent matmul over TMA tiles whose epilogue computes the group's buffers
from the accumulator. The bias is added and the sum rounded to the product's dtype
first, as cuBLAS does, so the epilogue reads the value eager reads back.

Such a kernel takes seconds to compile (a pipelined wgmma loop), which would cost
the first call more than the fusion saves in many calls; so it is a second tier. The
group's launcher calls the library and the plain pointwise kernel until the fused
kernel, compiled by a compile worker in the background, is loaded (``launch``;
``config.matmul_epilogue`` = "background"); "sync" compiles it before the first
launch instead (tests), and "off", the default, fuses nothing: on the H100 machine the
fused Linear+GELU (8192x4096 @ 4096x16384 bf16) measured level with cuBLAS and a
separate GELU pass, so it does not yet pay for its compile. Where TMA is missing
(before Hopper) or an operand is not 16-byte aligned at a call, the launcher keeps
the library tier.
"""
from __future__ import annotations

import logging
import threading

import torch

from .... import config
from ... import ir
from ...matmul_fusion import operands

aten = torch.ops.aten
_log = logging.getLogger("kiln.kernels")

#: Tile shape and schedule of the fused kernel on a GPU (measured on the H100 for
#: 8192x4096 @ 4096x16384 bf16: 128x256x64, 8 warps, 4 stages, groups of 8 tile rows).
TILE_M, TILE_N, TILE_K, WARPS, STAGES, GROUP_M = 128, 256, 64, 8, 4, 8


# --- code ----------------------------------------------------------------------------
def tiles(m: int, n: int, k: int, interpret: bool) -> tuple:
    """(BM, BN, BK): the GPU's tile, or under the interpreter the smallest powers of two
    that cover small test shapes (at least 16, as tl.dot needs)."""
    if not interpret:
        return TILE_M, TILE_N, TILE_K

    def p2(x, lo, hi):
        v = lo
        while v < min(x, hi):
            v *= 2
        return v
    return p2(m, 16, 64), p2(n, 32, 64), p2(k, 16, 32)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def num_sms(interpret: bool) -> int:
    if interpret or not torch.cuda.is_available():
        return 4
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def source(name: str, g, params: list, writes: set, lay: dict, dtypes: dict,
           interpret: bool) -> tuple:
    """(kernel source, parameter names, constexprs, options, positions in ``params``
    of the outputs stored through TMA descriptors) of the fused kernel of group ``g``:
    parameters ``kiln_a``/``kiln_b`` (TMA descriptors), then ``params`` (the group's
    own, less the product)."""
    from .exprs import TL, TBody, store_value, tindex

    class TileBody(TBody):
        """Loads in an [BM, BN/2] tile keep the shape of their index: a bias indexed
        by ``x1`` alone loads one [1, BN/2] row (masked by ``nmask``), not a tile of
        copies; arithmetic broadcasts."""

        def ptr(self, buf, index):
            return f"{buf} + {tindex(index)}"

        def load_mask(self, index):
            if not self.mask:
                return None
            used = index.vars()
            return ("emask" if used >= {"x0", "x1"} else "nmask" if "x1" in used
                    else "mmask" if "x0" in used else None)

    ext = g.matmul
    m, n, k = lay["m"], lay["n"], lay["k"]
    bm, bn, bk = tiles(m, n, k, interpret)
    out_t = TL[ext.dtype]
    b_load = ("kiln_b.load([pid_n * BN, ki * BK])", "tl.dot(a, b.T, acc)") if lay["b_kmajor"] \
        else ("kiln_b.load([ki * BK, pid_n * BN])", "tl.dot(a, b, acc)")
    origin = ", ".join(x.origin for x in [ext] + list(g.nodes) if getattr(x, "origin", ""))
    lines = [
        f"# {name}: {ext.op} [{m}, {k}] @ [{k}, {n}] with its epilogue; from {origin}",
        "@triton.jit",
        f"def {name}(kiln_a, kiln_b, {', '.join(params)}, NUM_SMS: tl.constexpr, "
        "BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):",
        f"    num_pid_m = tl.cdiv({m}, BM)",
        f"    num_pid_n = tl.cdiv({n}, BN)",
        "    num_pid_in_group = GROUP_M * num_pid_n",
        "    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS, "
        "flatten=True):",
        "        first_pid_m = (tile_id // num_pid_in_group) * GROUP_M",
        "        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)",
        "        pid_m = first_pid_m + (tile_id % group_size_m)",
        "        pid_n = (tile_id % num_pid_in_group) // group_size_m",
        "        acc = tl.zeros((BM, BN), dtype=tl.float32)",
        f"        for ki in range(tl.cdiv({k}, BK)):",
        "            a = kiln_a.load([pid_m * BM, ki * BK])",
        f"            b = {b_load[0]}",
        f"            acc = {b_load[1]}",
        "        acc0, acc1 = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))",
        "        x0 = (pid_m * BM + tl.arange(0, BM))[:, None]",
    ]
    if interpret:      # Triton 3.6's interpreter cannot range from a program id
        loop = lines.index("    for tile_id in tl.range(tl.program_id(0), num_pid_m * "
                           "num_pid_n, NUM_SMS, flatten=True):")
        steps = _cdiv(_cdiv(m, bm) * _cdiv(n, bn), num_sms(True))
        lines[loop:] = [f"    for step in range({steps}):",
                        "        tile_id = tl.program_id(0) + step * NUM_SMS",
                        "        if tile_id < num_pid_m * num_pid_n:"] + [
                            "    " + line for line in lines[loop + 1:]]
    masked = m % bm or n % bn
    counter = [0]
    vars_ = ir.loop_vars((m, n))
    # outputs stored row-major with rows TMA can address go through a descriptor
    # (the launcher makes it): the fastest store, and no masks at the edges
    own = ir.linear_index(vars_, (n, 1))
    tma_out = {node.name for node in g.nodes if node.name in writes
               and node.store_index(vars_) == own and (n * node.dtype.itemsize) % 16 == 0}
    ind = "            " if interpret else "        "
    if masked:
        lines.append(f"{ind}mmask = x0 < {m}")
    for half in (0, 1):
        lines.append(f"{ind}x1 = (pid_n * BN + {half} * (BN // 2) + tl.arange(0, BN // 2))[None, :]")
        if masked:
            lines += [f"{ind}nmask = x1 < {n}", f"{ind}emask = mmask & nmask"]
        body = TileBody({}, ind, counter, "emask" if masked else None)
        value = f"acc{half}"
        if lay["bias"] is not None:
            value = f"{value} + {body.render(lay['bias'])}"
        body.lines.append(f"{ind}mm{half} = ({value}).to({out_t}).to(tl.float32)")
        body.values[ext.name] = f"mm{half}"
        mk = ", mask=emask" if masked else ""
        for node in g.nodes:
            v = body.render(node.body)
            body.values[node.name] = v
            if node.name in tma_out:       # a TMA store clips the edges itself
                body.lines.append(
                    f"{ind}{node.name}.store([pid_m * BM, pid_n * BN + {half} * (BN // 2)], "
                    f"tl.broadcast_to({store_value(v, node.dtype)}, (BM, BN // 2)))")
            elif node.name in writes:
                body.lines.append(f"{ind}tl.store({body.ptr(node.name, node.store_index(vars_))}, "
                                  f"{store_value(v, node.dtype)}{mk})")
        lines += body.lines
    consts = {"NUM_SMS": num_sms(interpret), "BM": bm, "BN": bn, "BK": bk, "GROUP_M": GROUP_M}
    # a row-major B tile is staged transposed: one stage less fits in shared memory
    options = {"num_warps": WARPS if not interpret else 4,
               "num_stages": STAGES if lay["b_kmajor"] else STAGES - 1}
    stores = [i for i, p in enumerate(params) if p in tma_out]
    return "\n".join(lines), ["kiln_a", "kiln_b"] + list(params), consts, options, stores


def launcher_lines(fused: str, plain_call: str, g, lay: dict, params: list, consts: dict,
                   options: dict, stores: list) -> list:
    """The segment launcher's lines for a fused group: the operands as views, the fused
    kernel if its tier is up (``Launcher.matmul``), else the library call and the plain
    pointwise kernel (``plain_call``, a ``launch(...)`` line)."""
    ext = g.matmul
    bias = operands(ext)[0]

    def view(arg):
        return (f"torch.as_strided({arg.buf}, {tuple(arg.sizes)}, {tuple(arg.strides)}, "
                f"{arg.buf}.storage_offset() + {arg.offset})")
    a, b = lay["a"], lay["b"]
    spec = {"m": lay["m"], "n": lay["n"], "k": lay["k"], "b_kmajor": lay["b_kmajor"],
            "consts": consts, "options": options, "tma_stores": stores}
    call = (f"torch.ops.aten.addmm.default({view(bias)}, kiln_a, kiln_b)" if bias is not None
            else "torch.ops.aten.mm.default(kiln_a, kiln_b)")
    return [f"    kiln_a = {view(a)}",
            f"    kiln_b = {view(b)}",
            f"    if not launch.matmul({fused}, {spec!r}, kiln_a, kiln_b, ({', '.join(params)},)):",
            f"        {ext.name} = {call}",
            "        " + plain_call.strip()]


# --- the second tier at run time ------------------------------------------------------------
class _Tier:
    """One fused kernel: compiling, ready (``ck``), or failed (the library tier for good)."""

    def __init__(self):
        self.state, self.ck, self.error = "compiling", None, None
        self.done = threading.Event()


_tiers: dict = {}
_lock = threading.Lock()
stats = {"fused_launches": 0, "library_launches": 0}


def _descriptors(a, b, args, spec):
    """TMA descriptors of the operands; ``args`` with the TMA-stored outputs' too."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    def desc(t, block):
        return TensorDescriptor(t, list(t.shape), list(t.stride()), block)
    c = spec["consts"]
    bm, bn, bk = c["BM"], c["BN"], c["BK"]
    db = desc(b.t(), [bn, bk]) if spec["b_kmajor"] else desc(b, [bk, bn])
    args = list(args)
    for i in spec["tma_stores"]:
        args[i] = desc(args[i], [bm, bn // 2])
    return desc(a, [bm, bk]), db, args


def _grid(spec) -> int:
    c = spec["consts"]
    tiles_ = _cdiv(spec["m"], c["BM"]) * _cdiv(spec["n"], c["BN"])
    return min(c["NUM_SMS"], tiles_)


def _signature(kernel, descs, args, consts) -> dict:
    from triton.runtime.jit import mangle_type
    names = list(kernel.arg_names)
    sig = {nm: mangle_type(v) for nm, v in zip(names, list(descs) + list(args))}
    sig.update({nm: "constexpr" for nm in names[len(descs) + len(args):]})
    return sig


def _compile(tier, kernel, spec, sig, path, device) -> None:
    """Compile in a worker (or here when none runs) and load the binary."""
    from ...toolchain import triton_pool
    from ...toolchain import triton_binaries
    from ...toolchain import triton_setup
    from ...toolchain.triton_worker import compile_source
    from ...toolchain.triton_build import target
    job = {"path": path, "name": kernel.fn.__name__, "signature": sig,
           "consts": dict(spec["consts"]), "options": dict(spec["options"])}
    try:
        torch.cuda.set_device(device)
        ck = None
        slot = triton_pool.submit(job) if config.matmul_epilogue == "background" else None
        if slot is not None:
            reply = slot.get(timeout=triton_pool.WAIT_S)
            if "error" not in reply:
                ck = triton_binaries.compiled_kernel(reply, kernel.arg_names)
        if ck is None:
            ck = compile_source(kernel, sig, spec["consts"], target(), spec["options"])
        triton_setup.wait_for("driver")
        ck.run                      # loads the binary, builds the launcher
        tier.ck, tier.state = ck, "ready"
    except Exception as e:          # noqa: BLE001  (the library tier stays)
        tier.error, tier.state = f"{type(e).__name__}: {e}", "failed"
        _log.info("kernels: fused matmul epilogue %s not compiled (%s)", job["name"], tier.error)
    finally:
        tier.done.set()


def launch(kernel, spec: dict, a, b, args: tuple, path: str) -> bool:
    """Run the fused kernel if its tier is up and the operands suit it; False tells
    the launcher to call the library and the plain kernel instead."""
    consts = spec["consts"]
    if a.device.type != "cuda":         # the interpreter (tests): at once
        da, db, args = _descriptors(a, b, args, spec)
        kernel[(_grid(spec),)](da, db, *args, **consts, **spec["options"])
        stats["fused_launches"] += 1
        return True
    key = (id(kernel), a.device.index)     # a binary is loaded per device
    tier = _tiers.get(key)
    if tier is None:
        with _lock:
            tier = _tiers.get(key)
            if tier is None:
                tier = _tiers[key] = _Tier()
                _start(tier, kernel, spec, a, b, args, path)
    if tier.state != "ready" or any(t.data_ptr() % 16 for t in (a, b) + tuple(args)):
        stats["library_launches"] += 1
        return False
    da, db, args = _descriptors(a, b, args, spec)
    stream = torch._C._cuda_getCurrentRawStream(a.device.index)
    ck = tier.ck
    ck.run(_grid(spec), 1, 1, stream, ck.function, ck.packed_metadata, None, None, None,
           da, db, *args, *consts.values())
    stats["fused_launches"] += 1
    return True


def _start(tier, kernel, spec, a, b, args, path) -> None:
    if config.matmul_epilogue == "off" or torch.cuda.get_device_capability(a.device)[0] < 9:
        tier.state = "failed"
        tier.done.set()
        return
    da, db, args = _descriptors(a, b, args, spec)
    sig = _signature(kernel, (da, db), args, spec["consts"])
    work = (tier, kernel, spec, sig, path, a.device.index)
    if config.matmul_epilogue == "sync":
        _compile(*work)
    else:
        threading.Thread(target=_compile, args=work, daemon=True,
                         name="kiln-matmul-epilogue").start()


def wait(timeout: float | None = None) -> bool:
    """Wait for every fused kernel under compilation; True if there was any and none
    is left pending."""
    pending = [t for t in list(_tiers.values()) if t.state == "compiling"]
    return bool(pending) and all(t.done.wait(timeout) for t in pending)
