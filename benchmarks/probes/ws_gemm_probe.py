"""Probe v2: two partitions. 8 warps issue the TMA loads and the wgmmas (software
pipelined, STAGES deep, across tiles); 4 warps run the epilogue from shared memory.
12 warps in all, so every thread may hold 168 registers without setmaxnreg."""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    tma, mbarrier, fence_async_shared, warpgroup_mma, warpgroup_mma_wait)


@gluon.jit
def _coords(tile_id, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    in_group = GROUP_M * num_pid_n
    first_m = (tile_id // in_group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % size_m)
    pid_n = (tile_id % in_group) // size_m
    return pid_m, pid_n


@gluon.jit
def _issue_load(p, a_desc, b_desc, a_bufs, b_bufs, ready, k_iters, num_pid_m, num_pid_n,
                my_iters, GROUP_M: gl.constexpr, B_KMAJOR: gl.constexpr):
    """Load global iteration ``p`` of this program (tile p // k_iters, k step p % k_iters)."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    if B_KMAJOR:
        BN: gl.constexpr = b_desc.block_type.shape[0]
    else:
        BN: gl.constexpr = b_desc.block_type.shape[1]
    pred = p < my_iters
    tile_id = gl.program_id(0) + (p // k_iters) * gl.num_programs(0)
    ki = p % k_iters
    pid_m, pid_n = _coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
    s = p % STAGES
    bar = ready.index(s)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(a_desc, [pid_m * BM, ki * BK], bar, a_bufs.index(s), pred)
    if B_KMAJOR:
        tma.async_copy_global_to_shared(b_desc, [pid_n * BN, ki * BK], bar, b_bufs.index(s), pred)
    else:
        tma.async_copy_global_to_shared(b_desc, [ki * BK, pid_n * BN], bar, b_bufs.index(s), pred)


@gluon.jit
def _epi_part(descs, bufs, bars, dims, GROUP_M: gl.constexpr, B_KMAJOR: gl.constexpr, CH: gl.constexpr,
              bias_ptr, HAS_BIAS: gl.constexpr, NW: gl.constexpr, GELU: gl.constexpr):
    a_desc, b_desc, c_desc = descs
    a_bufs, b_bufs, epi = bufs
    ready, epi_ready, epi_empty = bars
    M, N, K = dims
    BM: gl.constexpr = epi.type.shape[0]
    BN: gl.constexpr = epi.type.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [NW, 1], [1, 0])
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    t = 0
    for tile_id in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        mbarrier.wait(epi_ready.index(0), t & 1)
        for r in gl.static_range(BM // CH):
            sub = epi.slice(r * CH, CH)
            if GELU == 1 or GELU == 3:
                x = sub.load(layout).to(gl.float32)
                y = x * 0.5 * (1.0 + gl.erf(x * 0.7071067811865476))
                sub.store(y.to(c_desc.dtype))
            elif GELU == 2:
                x = sub.load(layout).to(gl.float32)
                y = x * 0.5 * (1.0 + x)
                sub.store(y.to(c_desc.dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(c_desc, [pid_m * BM, pid_n * BN], epi)
        tma.store_wait(0)
        gl.thread_barrier()
        mbarrier.arrive(epi_empty.index(0), count=1)
        t += 1


@gluon.jit
def _mma_part(descs, bufs, bars, dims, GROUP_M: gl.constexpr, B_KMAJOR: gl.constexpr, CH: gl.constexpr,
              bias_ptr, HAS_BIAS: gl.constexpr, NW: gl.constexpr, GELU: gl.constexpr):
    a_desc, b_desc, c_desc = descs
    a_bufs, b_bufs, epi = bufs
    ready, epi_ready, epi_empty = bars
    M, N, K = dims
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BM: gl.constexpr = epi.type.shape[0]
    BN: gl.constexpr = epi.type.shape[1]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                         instr_shape=[16, BN, 16])
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    k_iters = gl.cdiv(K, BK)
    my_tiles = gl.cdiv(num_pid_m * num_pid_n - gl.program_id(0), gl.num_programs(0))
    my_iters = my_tiles * k_iters
    for p in gl.static_range(STAGES - 1):
        _issue_load(p, a_desc, b_desc, a_bufs, b_bufs, ready, k_iters, num_pid_m, num_pid_n,
                    my_iters, GROUP_M, B_KMAJOR)
    it = 0
    for t in range(my_tiles):
        tile_id = gl.program_id(0) + t * gl.num_programs(0)
        pid_m, pid_n = _coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        if HAS_BIAS:
            # the bias starts the sum (one rounding at the end, as cuBLAS's epilogue; the
            # fp32 sum's order differs from its by rounding only)
            offs = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_layout))
            bias = gl.load(bias_ptr + offs, mask=offs < N, other=0.0).to(gl.float32)
            acc = gl.zeros((BM, BN), gl.float32, acc_layout) + gl.expand_dims(bias, 0)
        else:
            acc = gl.zeros((BM, BN), gl.float32, acc_layout)
        for ki in range(k_iters if GELU < 3 else 0):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            if B_KMAJOR:
                b = b_bufs.index(s).permute((1, 0))
            else:
                b = b_bufs.index(s)
            acc = warpgroup_mma(a_bufs.index(s), b, acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=[acc])
            # every wgmma before this one is done in both warpgroups: its stage refills
            gl.thread_barrier()
            _issue_load(it + STAGES - 1, a_desc, b_desc, a_bufs, b_bufs, ready, k_iters,
                        num_pid_m, num_pid_n, my_iters, GROUP_M, B_KMAJOR)
            it += 1
        acc = warpgroup_mma_wait(0, deps=[acc])
        out = acc.to(c_desc.dtype)
        mbarrier.wait(epi_empty.index(0), (t & 1) ^ 1)
        epi.store(out)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(epi_ready.index(0), count=1)


@gluon.jit
def linear_gelu_ws(a_desc, b_desc, c_desc, bias_ptr, M, N, K,
                   HAS_BIAS: gl.constexpr, B_KMAJOR: gl.constexpr, STAGES: gl.constexpr,
                   GROUP_M: gl.constexpr, CH: gl.constexpr, EPI_WARPS: gl.constexpr,
                   EPI_REGS: gl.constexpr, GELU: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    epi = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    epi_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    epi_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    mbarrier.init(epi_ready.index(0), count=1)
    mbarrier.init(epi_empty.index(0), count=1)
    descs = (a_desc, b_desc, c_desc)
    bufs = (a_bufs, b_bufs, epi)
    bars = (ready, epi_ready, epi_empty)
    dims = (M, N, K)
    gl.warp_specialize([
        (_mma_part, (descs, bufs, bars, dims, GROUP_M, B_KMAJOR, CH, bias_ptr, HAS_BIAS, num_warps, GELU)),
        (_epi_part, (descs, bufs, bars, dims, GROUP_M, B_KMAJOR, CH, bias_ptr, HAS_BIAS, EPI_WARPS, GELU)),
    ], [EPI_WARPS], [EPI_REGS])


def layouts(BM, BN, BK, kmajor):
    bf16 = gl.bfloat16
    la = gl.NVMMASharedLayout.get_default_for([BM, BK], bf16)
    lb = gl.NVMMASharedLayout.get_default_for([BN, BK] if kmajor else [BK, BN], bf16)
    lc = gl.NVMMASharedLayout.get_default_for([BM, BN], bf16)
    return la, lb, lc


def signature(BM, BN, BK, kmajor):
    la, lb, lc = layouts(BM, BN, BK, kmajor)
    bshape = [BN, BK] if kmajor else [BK, BN]
    return {"a_desc": f"tensordesc<bf16[{BM}, {BK}],{la!r}>",
            "b_desc": f"tensordesc<bf16[{bshape[0]}, {bshape[1]}],{lb!r}>",
            "c_desc": f"tensordesc<bf16[{BM}, {BN}],{lc!r}>",
            "bias_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32"}
