"""The planner process (``python -m kiln.kernels.plan_worker``): reads plan requests
from stdin, answers each with the plan pickled as the graph cache pickles it, or the
error that stopped it (``plan_process`` says why a process plans).

Each request carries the graph written out, each input's layout (a ``Layout``: a
tensor of that layout with no data, so a plan that would read data fails here and
is made by the calling process instead), the target, kiln's settings, applied
around that plan, and the global torch settings plans read."""
from __future__ import annotations

import io
import sys


def _layout(m):
    import torch

    from .plan_process import TensorMeta
    if not isinstance(m, TensorMeta):
        return m
    return torch.Tensor._make_wrapper_subclass(
        Layout, m.shape, strides=m.stride, storage_offset=m.offset, dtype=m.dtype,
        device=m.device, requires_grad=False)


def _layout_class():
    import torch

    class Layout(torch.Tensor):
        """A tensor's layout without data: any op on it raises."""
        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise RuntimeError(f"kiln planner: {func} needs the inputs' data")
    return Layout


Layout = None


def _set_torch_state(state: dict) -> None:
    """The calling process's global torch settings a plan reads (``plan_process.torch_state``)."""
    import torch
    if "fp32_tensor_cores" in state:
        torch.backends.cuda.matmul.allow_tf32 = bool(state["fp32_tensor_cores"])


def answer(request: dict) -> dict:
    """One request's reply: {"id", "plan": bytes} or {"id", "error": str}."""
    from .. import config
    from . import compile as kcompile
    from . import plan_process
    from .toolchain import graph_cache
    try:
        gm = plan_process.decode(request["graph"])
        inputs = [_layout(a) for a in request["inputs"]]
        _set_torch_state(request.get("torch", {}))
        with config.patch(**request["settings"]):
            plan = kcompile.checked_plan(gm, inputs, request["target"])
        buf = io.BytesIO()
        graph_cache._Pickler(buf, protocol=5).dump(plan)
        return {"id": request["id"], "plan": buf.getvalue()}
    except Exception as e:      # noqa: BLE001  (the calling process plans it and reports)
        return {"id": request["id"], "error": f"{type(e).__name__}: {e}"[:500]}


def main() -> int:
    global Layout
    import gc
    import pickle

    from . import plan_process
    Layout = _layout_class()
    gc.disable()                # short-lived objects per plan; collected between plans
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    served = 0
    while True:
        data = plan_process.read_frame(stdin)
        if data is None:
            return 0
        reply = answer(pickle.loads(data))
        out = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            stdout.write(len(out).to_bytes(8, "little") + out)
            stdout.flush()
        except (BrokenPipeError, OSError):      # the calling process has gone
            return 0
        served += 1
        gc.collect(2 if served % 64 == 0 else 1)


if __name__ == "__main__":
    sys.exit(main())
