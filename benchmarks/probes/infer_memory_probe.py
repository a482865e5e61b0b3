"""H100 probe: where resnet18 bf16 inference's peak memory goes under kiln — the plain
first call, the recording call, replays — against eager (max_memory_allocated above the
model and inputs, per call)."""
import sys, os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import torch
import kiln
from kiln import config
from benchmarks.workloads import find

MB = 2 ** 20


def run(label, replay):
    config.cudagraphs = "auto" if replay else "0"
    torch.cuda.synchronize(); torch.cuda.empty_cache()
    w = find("resnet18/infer/bf16", "cuda", quick=False)
    inst = w.build("cuda")
    base = torch.cuda.memory_allocated()
    fn = inst.fn if label == "eager" else kiln.compile(inst.fn)
    out = []
    with torch.no_grad():
        for i in range(4):
            torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
            r = fn(*inst.inputs[i % len(inst.inputs)])
            torch.cuda.synchronize()
            out.append(round((torch.cuda.max_memory_allocated() - base) / MB, 1))
            del r
    print(f"{label:12s} model+inputs {base / MB:.1f} MB; per-call peak above them {out}; "
          f"reserved {torch.cuda.memory_reserved() / MB:.1f} MB", flush=True)
    del fn, inst


run("eager", False)
run("kiln-plain", False)
run("kiln", True)
