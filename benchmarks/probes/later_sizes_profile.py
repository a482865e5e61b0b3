"""cProfile of the later sizes of resnet18's first pass on the GPU (its calls after the
eighth, batch 1 left out): where a new size's host time goes once the stream's graphs
are compiled. Writes ``$OUT/prof_later.txt`` (top functions by own and cumulative time)
and ``prof_later.pstats``; prints each of the first calls' time and the GIL switch
interval it ran under.

    python -m benchmarks.probes.later_sizes_profile
"""
import sys, time, os, cProfile, pstats, io
import torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from benchmarks.dynamic_shapes import resnet18, sync
import kiln
from kiln.debug import timing
out = os.environ.get("OUT", "/tmp")
model, inputs, run, labels = resnet18("cuda", False)
fn = kiln.compile(model)
prof = cProfile.Profile()
times = []
with torch.no_grad():
    run(model, inputs[0]); sync("cuda")
    t00 = time.perf_counter()
    for i, (x, lab) in enumerate(zip(inputs, labels)):
        p = i >= 8 and x.shape[0] != 1
        t0 = time.perf_counter()
        if p: prof.enable()
        run(fn, x); sync("cuda")
        if p: prof.disable()
        times.append((lab, time.perf_counter() - t0, p, sys.getswitchinterval()))
    total = time.perf_counter() - t00
print("first pass", total)
print("profiled calls", sum(t for _, t, p, _ in times if p), "n", sum(p for _, _, p, _ in times))
for r in times[:12]: print(r)
s = io.StringIO(); st = pstats.Stats(prof, stream=s); st.sort_stats("tottime").print_stats(45)
st.sort_stats("cumulative").print_stats(70)
open(f"{out}/prof_later.txt", "w").write(s.getvalue())
prof.dump_stats(f"{out}/prof_later.pstats")
import threading; print("threads", [t.name for t in threading.enumerate()])
print(kiln.compile_times())
