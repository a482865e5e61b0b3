"""What ``precompile`` (at a module's load) and ``prepare`` (a background compile) both
enumerate: each compile of a module's kernels and its worker job
(``launcher._candidates``, ``launcher._worker_job``), on stand-in kernels — no GPU."""
import types

import torch

from kiln.kernels.codegen.triton import launcher


def _fn(src, names):
    return types.SimpleNamespace(src=src, arg_names=names)


def _config(warps):
    return types.SimpleNamespace(all_kwargs=lambda: {"num_warps": warps, "num_stages": 2})


def test_candidates_one_per_kernel_and_one_per_config_of_a_tuned_one():
    plain = _fn("def plain(): pass", ["x", "y", "XBLOCK"])
    tuned = types.SimpleNamespace(fn=_fn("def tuned(): pass", ["x", "RBLOCK"]),
                                  configs=[_config(4), _config(8)])
    mod = types.SimpleNamespace(plain=plain, tuned=tuned)
    f32 = torch.float32
    kinfo = [("plain", ["a", "b"], [f32, f32], {"XBLOCK": 128}, 4, False),
             ("tuned", ["a"], [f32], {"RBLOCK": 64}, 4, True)]
    got = list(launcher._candidates(mod, kinfo, 0))
    assert [(c[0], c[1], c[4], c[5], c[6]) for c in got] == [
        ("plain", 2, plain, {"num_warps": 4}, None),
        ("tuned", 1, tuned.fn, {"num_warps": 4, "num_stages": 2}, 0),
        ("tuned", 1, tuned.fn, {"num_warps": 8, "num_stages": 2}, 1)]
    keys = [c[7] for c in got]
    assert len(set(keys)) == 3
    assert keys[0] == launcher.kernel_key(plain, [f32, f32], {"XBLOCK": 128}, {"num_warps": 4}, 0)
    job = launcher._worker_job("/m.py", "plain", plain, [f32, f32], {"XBLOCK": 128},
                               {"num_warps": 4})
    assert job == {"path": "/m.py", "name": "plain",
                   "signature": {"x": "*fp32", "y": "*fp32", "XBLOCK": "constexpr"},
                   "consts": {"XBLOCK": 128}, "options": {"num_warps": 4}}
    assert launcher._worker_job("/m.py", "plain", plain, [f32, f32], {}, {}) is None
