"""Whether kernels may call glibc's vector math (libmvec), and the flags that turn it on.

The prelude declares libm's transcendentals ``simd`` under ``KILN_MVEC``, so that GCC
calls libmvec's AVX2 / AVX-512 variants from ``#pragma omp simd`` loops (documented
error at most 4 ulp; special values — NaN, ±inf, ±0 — as the scalar functions). That
needs glibc ≥ 2.35 (the full set of functions) and linking ``-lmvec``. Before the first
kernel is built, a probe — a vectorised loop of every declared function, compiled with
kiln's flags, linked and run — decides; it checks that results agree with the scalar
functions within 8 ulp and that the special values are the scalar ones. The verdict is
remembered on disk per (compiler version, flags). Off (``KILN_CPU_VECTOR_MATH=0``) or
failing, kernels call scalar libm as before.
"""
from __future__ import annotations

import logging
import os
import subprocess
import tempfile

from ... import config
from ...disk_cache import key_of, read_entry, write_entry

log = logging.getLogger("kiln")

#: Defined for the compiler, and linked after the source, when the probe passes.
DEFINES = ["-DKILN_MVEC"]
LIBS = ["-lmvec"]

_PROBE = r"""
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <limits>
#define KILN_MVEC 1
PRELUDE
#define N 4096
template <class T> static int64_t ulps(T a, T b) {
  if (a != a || b != b) return (a != a) == (b != b) ? 0 : 1 << 30;
  if (a == b) return std::signbit(a) == std::signbit(b) ? 0 : 1 << 30;
  long double d = std::fabs((long double)a - (long double)b);
  long double u = std::fabs(std::nextafter(b, std::numeric_limits<T>::infinity()) - b);
  return int64_t(d / u);
}
template <class T> __attribute__((noinline)) static void kernel(
    const T* __restrict__ x, const T* __restrict__ y, T* __restrict__ r0, T* __restrict__ r1,
    T* __restrict__ r2, T* __restrict__ r3, T* __restrict__ r4, T* __restrict__ r5) {
  #pragma omp simd
  for (int i = 0; i < N; ++i) {
    r0[i] = std::sin(x[i]); r1[i] = std::erf(x[i]); r2[i] = std::log1p(y[i]);
    r3[i] = std::pow(y[i], x[i]); r4[i] = std::atan2(x[i], y[i]); r5[i] = std::expm1(x[i]);
  }
}
template <class T> static int check() {
  static T x[N], y[N], r[6][N];
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  for (int i = 0; i < N; ++i) { x[i] = T(i - N / 2) / T(N / 8); y[i] = T(0.75) + T(i) / T(N); }
  x[0] = inf; x[1] = -inf; x[2] = nan; x[3] = T(0); x[4] = -T(0); x[5] = T(1e30);
  kernel<T>(x, y, r[0], r[1], r[2], r[3], r[4], r[5]);
  for (int i = 0; i < N; ++i) {
    volatile T xi = x[i], yi = y[i];
    T want[6] = {std::sin(xi), std::erf(xi), std::log1p(yi), std::pow(yi, xi),
                 std::atan2(xi, yi), std::expm1(xi)};
    for (int k = 0; k < 6; ++k) if (ulps(r[k][i], want[k]) > 8) {
      std::printf("%d %d %g %g\n", i, k, double(r[k][i]), double(want[k])); return 1; }
  }
  return 0;
}
int main() { return check<float>() | check<double>(); }
"""


def _probe(cxx: str, flags: list[str], prelude: str) -> tuple[bool, str]:
    build = [f for f in flags if f not in ("-shared", "-fPIC")]
    with tempfile.TemporaryDirectory(prefix="kiln-mvec-") as d:
        src, exe = os.path.join(d, "mvec.cpp"), os.path.join(d, "mvec")
        with open(src, "w") as f:
            f.write(_PROBE.replace("PRELUDE", prelude))
        try:
            r = subprocess.run([cxx, *build, *DEFINES, src, "-o", exe, *LIBS],
                               capture_output=True, text=True)
            if r.returncode != 0:
                return False, "does not build: " + (r.stderr.splitlines() or ["?"])[0]
            sym = subprocess.run(["nm", exe], capture_output=True, text=True).stdout
            if "_ZGV" not in sym:
                return False, "the loop did not call libmvec"
            run = subprocess.run([exe], capture_output=True, text=True)
        except OSError as e:
            return False, f"could not run ({e})"
        if run.returncode != 0:
            return False, "results differ from scalar libm: " + run.stdout.strip()
    return True, ""


def vector_math_flags(cxx: str, flags: list[str], version: str, prelude: str) -> tuple[list[str], list[str]]:
    """(compile flags, link libraries) that switch the prelude's vector math on, or two
    empty lists when it is off or the probe fails (remembered on disk)."""
    if not config.cpu_vector_math:
        return [], []
    key = key_of("mvec", cxx, " ".join(flags), version, _PROBE, prelude)
    found = read_entry("cpp", key, ".mvec")
    if found is not None:
        ok = found[1].decode() == "1"
    else:
        ok, why = _probe(cxx, flags, prelude)
        if not ok:
            log.warning("kiln: vector math (libmvec) off for C++ kernels: %s", why)
        try:
            write_entry("cpp", key, ".mvec", b"1" if ok else b"0")
        except OSError:
            pass                                  # probed again by the next process
    return (list(DEFINES), list(LIBS)) if ok else ([], [])
