"""H100 probe: does any cuBLASLt algorithm beat the one PyTorch's addmm gets, for the
GELU-MLP's two products (bf16, bias epilogue)? Enumerates the heuristic's candidates
through ctypes, checks each against torch, times them, then interleaves the best few
with torch.addmm over several rounds."""
import ctypes, statistics, sys
import torch
import torch.nn.functional as F
from probe_timing import median_ms  # noqa: E402  (benchmarks/probes on sys.path)

lt = ctypes.CDLL("libcublasLt.so.13")
c_void_p, c_int, c_size_t, c_uint64, c_int64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int64


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class Heur(ctypes.Structure):
    _fields_ = [("algo", Algo), ("workspaceSize", c_size_t), ("state", c_int),
                ("wavesCount", ctypes.c_float), ("reserved", c_int * 4)]


def ok(st, what):
    if st != 0:
        raise RuntimeError(f"{what}: cublas status {st}")


handle = c_void_p()
ok(lt.cublasLtCreate(ctypes.byref(handle)), "create")
WS = 64 << 20
workspace = torch.empty(WS, dtype=torch.uint8, device="cuda")
R_16BF, R_32F, COMPUTE_32F = 14, 0, 68
OP_N, OP_T = 0, 1


def attr(fn, obj, a, value, ctype):
    v = ctype(value)
    ok(fn(obj, c_int(a), ctypes.byref(v), c_size_t(ctypes.sizeof(v))), f"attr {a}")


class LtLinear:
    """y = x @ w.T + b through cublasLtMatmul with a chosen algorithm (TN, column-major:
    D[N, M] = W[K, N]^T X[K, M])."""

    def __init__(self, x, w, b, y):
        self.x, self.w, self.b, self.y = x, w, b, y
        M, K = x.shape
        N = w.shape[0]
        self.desc = c_void_p()
        ok(lt.cublasLtMatmulDescCreate(ctypes.byref(self.desc), c_int(COMPUTE_32F), c_int(R_32F)), "desc")
        attr(lt.cublasLtMatmulDescSetAttribute, self.desc, 3, OP_T, ctypes.c_int32)   # TRANSA
        attr(lt.cublasLtMatmulDescSetAttribute, self.desc, 4, OP_N, ctypes.c_int32)   # TRANSB
        attr(lt.cublasLtMatmulDescSetAttribute, self.desc, 7, 4, ctypes.c_uint32)     # EPILOGUE_BIAS
        attr(lt.cublasLtMatmulDescSetAttribute, self.desc, 8, b.data_ptr(), c_uint64) # BIAS_POINTER
        attr(lt.cublasLtMatmulDescSetAttribute, self.desc, 26, R_16BF, ctypes.c_int32) # BIAS_DATA_TYPE
        self.la, self.lb, self.lc = c_void_p(), c_void_p(), c_void_p()
        ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(self.la), c_int(R_16BF), c_uint64(K), c_uint64(N), c_int64(K)), "la")
        ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(self.lb), c_int(R_16BF), c_uint64(K), c_uint64(M), c_int64(K)), "lb")
        ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(self.lc), c_int(R_16BF), c_uint64(N), c_uint64(M), c_int64(N)), "lc")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def algos(self, n=32):
        pref = c_void_p()
        ok(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
        attr(lt.cublasLtMatmulPreferenceSetAttribute, pref, 1, WS, c_uint64)
        res = (Heur * n)()
        cnt = c_int()
        ok(lt.cublasLtMatmulAlgoGetHeuristic(handle, self.desc, self.la, self.lb, self.lc, self.lc, pref,
                                             c_int(n), res, ctypes.byref(cnt)), "heuristic")
        return [res[i] for i in range(cnt.value) if res[i].state == 0]

    def run(self, h):
        st = lt.cublasLtMatmul(handle, self.desc, ctypes.byref(self.alpha), c_void_p(self.w.data_ptr()), self.la,
                               c_void_p(self.x.data_ptr()), self.lb, ctypes.byref(self.beta),
                               c_void_p(self.y.data_ptr()), self.lc, c_void_p(self.y.data_ptr()), self.lc,
                               ctypes.byref(h.algo), c_void_p(workspace.data_ptr()), c_size_t(WS),
                               c_void_p(torch.cuda.current_stream().cuda_stream))
        ok(st, "matmul")
        return self.y


def t(fn, reps=30):
    return median_ms(fn, reps)


torch.manual_seed(0)
M, D, H = 8192, 4096, 16384
for name, (K, N) in {"mm1 4096->16384": (D, H), "mm2 16384->4096": (H, D)}.items():
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ref = F.linear(x, w, b)
    L = LtLinear(x, w, b, y)
    hs = L.algos()
    print(f"== {name}: {len(hs)} candidates; torch addmm {t(lambda: F.linear(x, w, b)):.3f} ms", flush=True)
    timed = []
    for i, h in enumerate(hs):
        try:
            got = L.run(h).clone()
            err = (got.float() - ref.float()).abs().max().item()
            ms = t(lambda: L.run(h))
        except Exception as e:
            print(f"  algo {i}: {e}")
            continue
        timed.append((ms, i))
        print(f"  algo {i}: {ms:.3f} ms waves {h.wavesCount:.2f} ws {h.workspaceSize >> 10} KiB "
              f"id {h.algo.data[0] & 0xffff} maxdiff {err:.3g}", flush=True)
    best = [i for _, i in sorted(timed)[:3]]
    fns = {"torch": lambda: F.linear(x, w, b), **{f"algo{i}": (lambda h=hs[i]: L.run(h)) for i in best}}
    rounds = {k: [] for k in fns}
    for r in range(8):
        ks = list(fns)
        for k in ks[r % len(ks):] + ks[:r % len(ks)]:
            rounds[k].append(t(fns[k]))
    base = statistics.median(rounds["torch"])
    for k, v in rounds.items():
        print(f"  {k:8s} {statistics.median(v):.3f} ms x{base / statistics.median(v):.3f} {[round(a, 3) for a in v]}", flush=True)
    del x, w, b, y, ref
