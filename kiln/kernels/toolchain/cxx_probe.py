"""A check of the C++ compiler against miscompiles known to hit kiln's kernels.

GCC 13.3 (Ubuntu 24.04's compiler, on the GPU machine) miscompiles, at ``-O3
-march=native``, a loop nest kiln generates for two ``slice_scatter`` outputs of one
input: its loop if-conversion gives the scattered block zeros (``-fno-tree-loop-
if-convert`` or ``-O2`` make it right; GCC 12.2 is right). A compiler that silently
computes wrong answers is worse than a slow one, so before the first kernel of a
process is built, each probe below is compiled with kiln's flags and run; when one
fails, the workarounds are tried in order and the first that makes every probe pass is
added to the flags. The verdict is remembered on disk per (compiler version, flags), so
only the first process on a machine pays for it (about 0.3 s).
"""
from __future__ import annotations

import logging
import os
import subprocess
import tempfile

from ...disk_cache import key_of, read_entry, write_entry

log = logging.getLogger("kiln")

#: Each probe is a program that exits 0 when compiled correctly. The kernel is kiln's
#: own output for ``slice_scatter(x, y, 0, 1, 3), slice_scatter(x, z, 1, -3, None)``
#: on x of shape (4, 5, 3) with strides (3, 12, 1).
PROBES = {
    "gcc13-ifcvt-slice-scatter": r"""
#include <cstdint>
__attribute__((noinline)) static void kernel(const float* __restrict__ in0,
    const float* __restrict__ in2, const float* __restrict__ in3,
    float* __restrict__ buf2, float* __restrict__ buf3) {
  for (int64_t x0 = 0; x0 < 4; ++x0) {
    for (int64_t x1 = 0; x1 < 5; ++x1) {
      for (int64_t x2 = 0; x2 < 3; ++x2) {
        bool t2 = (x0 >= int64_t(1)) && (x0 < int64_t(3));
        float t3 = (t2 ? in2[15*x0 + 3*x1 + x2 + -15] : float(0));
        float t4 = in0[3*x0 + 12*x1 + x2];
        buf2[3*x0 + 12*x1 + x2] = (t2 ? t3 : t4);
        bool t8 = (x1 >= int64_t(2)) && (x1 < int64_t(5));
        float t9 = (t8 ? in3[9*x0 + 3*x1 + x2 + -6] : float(0));
        buf3[3*x0 + 12*x1 + x2] = (t8 ? t9 : t4);
      }
    }
  }
}
int main() {
  float in0[60], in2[30], in3[36], b2[60], b3[60];
  for (int i = 0; i < 60; ++i) in0[i] = 1000 + i;
  for (int i = 0; i < 30; ++i) in2[i] = 2000 + i;
  for (int i = 0; i < 36; ++i) in3[i] = 3000 + i;
  kernel(in0, in2, in3, b2, b3);
  for (int x0 = 0; x0 < 4; ++x0)
    for (int x1 = 0; x1 < 5; ++x1)
      for (int x2 = 0; x2 < 3; ++x2) {
        int o = 3*x0 + 12*x1 + x2;
        float e2 = (x0 >= 1 && x0 < 3) ? in2[15*(x0-1) + 3*x1 + x2] : in0[o];
        float e3 = x1 >= 2 ? in3[9*x0 + 3*(x1-2) + x2] : in0[o];
        if (b2[o] != e2 || b3[o] != e3) return 1;
      }
  return 0;
}
""",
}

#: Tried in order; the first one that makes every probe pass is kept.
WORKAROUNDS = [["-fno-tree-loop-if-convert"], ["-fno-tree-vectorize"], ["-O1"]]


def _passes(cxx: str, flags: list[str], name: str, source: str, d: str) -> bool:
    src = os.path.join(d, name + ".cpp")
    exe = os.path.join(d, name)
    with open(src, "w") as f:
        f.write(source)
    build = [f for f in flags if f not in ("-shared", "-fPIC")]
    try:
        r = subprocess.run([cxx, *build, src, "-o", exe], capture_output=True, text=True)
    except OSError:
        return True      # no compiler to run: the kernel build says so, not this check
    if r.returncode != 0:
        return True      # a probe the compiler cannot build says nothing about miscompiles
    try:
        return subprocess.run([exe], capture_output=True).returncode == 0
    except OSError:
        return True      # the compiler made no program: the kernel build says so


def failing_probes(cxx: str, flags: list[str]) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="kiln-probe-") as d:
        return [n for n, s in PROBES.items() if not _passes(cxx, flags, n, s, d)]


def workaround_flags(cxx: str, flags: list[str], version: str) -> list[str]:
    """Flags to add to ``flags`` so that ``cxx`` passes every probe (remembered on disk)."""
    key = key_of("probe", cxx, " ".join(flags), version, *PROBES)
    found = read_entry("cpp", key, ".flags")
    if found is not None:
        return found[1].decode().split()
    extra: list[str] = []
    bad = failing_probes(cxx, flags)
    if bad:
        for w in WORKAROUNDS:
            if not failing_probes(cxx, flags + w):
                extra = w
                break
        log.warning("kiln: %s miscompiles %s; kernels are built with %s", version,
                    ", ".join(bad), " ".join(extra) or "no workaround found")
    try:
        write_entry("cpp", key, ".flags", " ".join(extra).encode())
    except OSError:
        pass                                  # checked again by the next process
    return extra
