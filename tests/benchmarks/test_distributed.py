"""benchmarks/distributed.py launched as the README says (torchrun, 2 gloo ranks on the
CPU): every backend's row is present, without error, and kiln's losses are eager's."""
import json
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_torchrun_two_ranks(tmp_path, mode):
    out = tmp_path / "r.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.abspath(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
           "-m", "benchmarks.distributed", "--model", "gpt2", "--mode", mode, "--backends", "eager,kiln",
           "--steps", "2", "--warmup", "2", "--json", str(out), "--trace", str(tmp_path / "tr")]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {row["backend"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"eager", "kiln"} and not any("error" in r for r in rows.values()), rows
    assert rows["kiln"]["loss_err"] < 1e-5, rows["kiln"]
    assert sorted(os.listdir(tmp_path / "tr")) == ["eager-rank0.json", "eager-rank1.json",
                                                    "kiln-rank0.json", "kiln-rank1.json"]
    overlapped, total = rows["kiln"]["comm_before_backward_end"][0]
    assert total > 0 and overlapped > 0, rows["kiln"]


def test_gpu_comm_overlap_counts_reducing_kernel_time_under_compute(tmp_path):
    """The GPU trace summary: all-reduce / reduce-scatter time while a non-NCCL kernel ran."""
    from benchmarks.distributed import gpu_comm_overlap

    def k(name, ts, dur):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}

    events = [k("ampere_sgemm", 0, 10), k("triton_poi_fused", 8, 4),            # compute 0..12
              k("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 5, 10),           # 7 of 10 hidden
              k("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 20, 5),         # none hidden
              k("ncclDevKernel_AllGather_RING_LL", 0, 30),                     # not a reduction
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert gpu_comm_overlap(str(path)) == {"comm_us": 15, "overlapped_us": 7, "fraction": round(7 / 15, 3)}
