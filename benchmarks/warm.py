"""Second-process entry: time first calls with warm on-disk caches.

``python -m benchmarks.warm SPEC.json OUT.jsonl``: for each item of the spec, point the
backend at the cache directory the cold run filled, build the workload afresh, compile
and time the first call (forward, plus backward for training). One JSON line per item
is appended as soon as it is measured.
"""
from __future__ import annotations

import json
import sys


def main(spec_path: str, out_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    from benchmarks.backends import make_backend
    from benchmarks.harness import first_call, short_error
    from benchmarks.workloads import find

    import os

    import torch

    tf32 = os.environ.get("KILN_BENCH_TF32")
    if tf32 in ("on", "off"):  # the same numerics as the main process
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32 == "on"
    backend = make_backend(spec["backend"])
    _import_everything(backend, spec["device"])
    for item in spec["items"]:
        rec = {"workload": item["workload"]}
        try:
            w = find(item["workload"], spec["device"], spec["quick"])
            backend.reset()
            inst = w.build(spec["device"])
            backend.use_cache_dir(item["cache_dir"])
            compiled = backend.compile(inst.fn)
            rec["warm_compile_s"], _ = first_call(compiled, inst, w.mode, spec["device"])
        except Exception as e:  # noqa: BLE001
            rec["error"] = short_error(e)
        with open(out_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        try:
            backend.reset()
        except Exception:  # noqa: BLE001
            pass
    return 0


def _import_everything(backend, device: str) -> None:
    """Compile and run a throwaway function first (its cache in a scratch folder), so
    the first measured item doesn't also pay for the backend's lazy imports."""
    import tempfile

    import torch

    with tempfile.TemporaryDirectory(prefix="kiln-bench-prewarm-") as d:
        try:
            backend.use_cache_dir(d)
            backend.compile(_prewarm)(torch.ones(8, device=device))
            backend.reset()
        except Exception:  # noqa: BLE001 — the real items will record what is wrong
            pass


def _prewarm(x):
    return torch_sin(x) * 2 + 1


def torch_sin(x):
    return x.sin()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
