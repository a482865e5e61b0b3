"""A size stream's first pass, call by call: each call's time and the compile stages it
ran (``kiln.debug.timing``, own times above 5 ms; ``probe.*``: a size's specialisation,
its first run and a run op by op, timed here), then two more passes (their calls over
20 ms, with stages: with every input synchronised, a call that records a CUDA graph or
builds a late variant) and the stage table.

    python -m benchmarks.probes.first_pass_stages cuda llama|resnet18   (SMALL=1: tiny sizes)
"""
import sys, time, os
import torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..'))
from benchmarks.dynamic_shapes import llama, resnet18, sync
import kiln
from kiln.debug import timing
dev, wl = sys.argv[1], sys.argv[2]
small = os.environ.get("SMALL") == "1"
model, inputs, run, labels = {"llama": llama, "resnet18": resnet18}[wl](dev, small)


def _timed_as(obj, name, stage, sync=False):
    """``obj.name`` timed as ``stage`` (the device synchronised before it ends): the
    parts of a call no kiln stage times — the size's specialisation, its first run,
    a run op by op while its class compiles."""
    f = getattr(obj, name)

    def wrapped(*a, **k):
        with timing.timed(stage):
            r = f(*a, **k)
            if sync and dev == "cuda":
                torch.cuda.synchronize()
            return r
    setattr(obj, name, wrapped)


from kiln.autograd import specialize as _specialize
from kiln.kernels import compile as _kcompile, size_prebuild as _prebuild
_timed_as(_specialize, "specialise", "probe.specialise")
_timed_as(_kcompile.CompiledGraph, "_first_call", "probe.first_run", sync=True)
_timed_as(_prebuild.Pending, "__call__", "probe.op_by_op", sync=True)
fn = kiln.compile(model)


def timed_call(x):
    """(seconds, {stage: own seconds over 5 ms}) of one synchronised call."""
    before = dict(timing.own())
    t0 = time.perf_counter()
    run(fn, x)
    sync(dev)
    dt = time.perf_counter() - t0
    return dt, {k: v - before.get(k, 0.0) for k, v in timing.own().items()
                if v - before.get(k, 0.0) > 0.005}


rows, later = [], []       # later: passes 2 and 3's calls over 20 ms, with their stages
with torch.no_grad():
    run(model, inputs[0]); sync(dev)      # eager once: library set-up
    t00 = time.perf_counter()
    for x, lab in zip(inputs, labels):
        rows.append((lab.split()[-1], *timed_call(x)))
    total = time.perf_counter() - t00
    passes = []
    for k in (2, 3):
        t0 = time.perf_counter()
        for x, lab in zip(inputs, labels):
            dt, d = timed_call(x)
            if dt > 0.02:
                later.append((k, lab.split()[-1], dt, d))
        passes.append(time.perf_counter() - t0)
    second, third = passes
print(f"{wl} {os.environ.get('TAG','')}: first pass {total:.2f} s, second {second:.2f} s, third {third:.3f} s")
for lab, dt, d in rows:
    print(f"  {lab:>4} {dt:6.3f}  " + " ".join(f"{k.replace('kernels.', 'k.')}={v:.3f}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])))
for k, lab, dt, d in later:
    print(f"  pass {k}: {lab:>4} {dt:6.3f}  " + " ".join(f"{n.replace('kernels.', 'k.')}={v:.3f}" for n, v in sorted(d.items(), key=lambda kv: -kv[1])))
from kiln.kernels import size_prebuild
print("calls run op by op while their class compiled:", size_prebuild.eager_calls)
print(kiln.compile_times())
