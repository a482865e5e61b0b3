"""The backends the harness compares, one small class each, looked up by name.

Every backend answers the same four questions — how to start cold (fresh on-disk
caches), how to compile a callable, how to count graphs and breaks, how to forget what
it compiled — so the harness loop has no per-backend ``if``. kiln is imported lazily
inside the methods: while kiln is unfinished (or absent), its cells record the error
instead of stopping the run.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class Explained:
    graph_count: int
    graph_break_count: int


class Eager:
    """Plain PyTorch: the reference every speedup and every accuracy check is against."""

    family = "eager"

    def __init__(self, name: str = "eager"):
        self.name = name

    def use_cache_dir(self, path: str) -> None:
        pass

    def compile(self, fn):
        return fn

    def explain(self, fn, args) -> Explained | None:
        return None

    def reset(self) -> None:
        pass


class TorchCompile:
    """``torch.compile(fn, backend=inner)``; ``torch.compile:eager`` picks another inner
    backend (the test uses it to stay fast). Cold starts get a fresh Inductor/Triton
    cache directory; ``reset`` is ``torch._dynamo.reset()`` (allowed in benchmarks/)."""

    family = "torch.compile"

    def __init__(self, name: str = "torch.compile", inner: str = "inductor", mode: str | None = None):
        self.name = name
        self.inner = inner
        self.mode = mode

    def use_cache_dir(self, path: str) -> None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
        os.environ["TRITON_CACHE_DIR"] = os.path.join(path, "triton")

    def compile(self, fn):
        import torch

        if self.mode is not None:
            return torch.compile(fn, backend=self.inner, mode=self.mode)
        return torch.compile(fn, backend=self.inner)

    def explain(self, fn, args) -> Explained:
        import torch._dynamo

        out = torch._dynamo.explain(fn)(*args)
        return Explained(out.graph_count, out.graph_break_count)

    def reset(self) -> None:
        import torch._dynamo

        torch._dynamo.reset()


class Kiln:
    """``kiln.compile(fn, backend=inner)``; ``inner=None`` means kiln's default backend.
    Cold starts point ``KILN_CACHE_DIR`` (and kiln.config.cache_dir, read at import)
    and Triton's cache at a fresh directory."""

    family = "kiln"

    def __init__(self, name: str, inner: str | None):
        self.name = name
        self.inner = inner

    def use_cache_dir(self, path: str) -> None:
        os.environ["KILN_CACHE_DIR"] = path
        os.environ["TRITON_CACHE_DIR"] = os.path.join(path, "triton")
        try:
            import kiln.config
        except Exception:  # kiln unimportable: the compile step will record why
            return
        kiln.config.cache_dir = path

    def trial_calls(self) -> int:
        """Calls to make before timing, beyond the usual warm-up: kiln's perf fallback
        times each graph against eager over its first calls (at most ``MAX_CALLS``) and
        those calls are a trial's, not the steady state's."""
        try:
            from kiln import config
            from kiln.kernels.runtime.perf_fallback import MAX_CALLS
        except Exception:  # noqa: BLE001 -- kiln unimportable: the compile step says why
            return 0
        return MAX_CALLS if config.perf_fallback else 0

    def settle(self) -> bool:
        """Wait for kernels kiln compiles in the background after a first call; True
        if there were any (the calls from then on run them)."""
        import kiln
        return kiln.wait_for_compiles(600)

    def compile(self, fn):
        import kiln

        if self.inner is None:
            return kiln.compile(fn)
        return kiln.compile(fn, backend=self.inner)

    def explain(self, fn, args) -> Explained:
        import kiln

        out = kiln.explain(fn)(*args)
        return Explained(int(out.graph_count), int(out.graph_break_count))

    def reset(self) -> None:
        import kiln

        kiln.reset()


DEFAULT_BACKENDS = ("eager", "torch.compile", "kiln-eager", "kiln-aot_eager", "kiln")

_FIXED = {
    "eager": lambda: Eager(),
    "torch.compile": lambda: TorchCompile(),
    "torch.compile-ro": lambda: TorchCompile("torch.compile-ro", mode="reduce-overhead"),
    "kiln": lambda: Kiln("kiln", None),
    "kiln-eager": lambda: Kiln("kiln-eager", "eager"),
    "kiln-aot_eager": lambda: Kiln("kiln-aot_eager", "aot_eager"),
}


def make_backend(name: str):
    """A backend object from its command-line name.

    Fixed names are in ``_FIXED``; ``torch.compile:<inner>`` and ``kiln:<inner>`` name
    any inner backend registered with torch.compile or kiln.
    """
    if name in _FIXED:
        return _FIXED[name]()
    family, sep, inner = name.partition(":")
    if sep and family == "torch.compile" and inner:
        return TorchCompile(name, inner)
    if sep and family == "kiln" and inner:
        return Kiln(name, inner)
    raise ValueError(
        f"unknown backend {name!r}; use one of {', '.join(_FIXED)}, "
        "torch.compile:<backend> or kiln:<backend>"
    )
