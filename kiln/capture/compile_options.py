"""``kiln.compile(mode=..., options=...)``: what each mode means in kiln, the options
kiln implements (``kiln.list_options()``), and the compiled function that applies them
to ``kiln.config`` while it compiles and runs.

A mode or option is a set of ``kiln.config`` settings, patched for the length of each
call of that compiled function (its captures, the backend's compiles, its graphs' runs)
and for the backward graphs the kernel backend compiles later, inside
``loss.backward()`` (``config.bound``). Anything kiln does not implement is rejected, naming
the valid choices, rather than accepted and ignored.
"""
# Names torch.compile only as the reference for the contract kiln follows (DESIGN.md);
# nothing here imports or calls torch's compiler stack.
from __future__ import annotations

import difflib

from kiln import config
from kiln.capture.eval_frame import CompiledFunction

#: mode -> the settings it stands for
MODES = {
    "default": {},
    # CUDA-graph replay of every graph, small ones too (launch overhead is the cost)
    "reduce-overhead": {"cudagraphs": "1"},
    # replay as above, and every Triton reduction kernel times several launch configs
    "max-autotune": {"cudagraphs": "1", "autotune_min_numel": 0},
    "max-autotune-no-cudagraphs": {"cudagraphs": "0", "autotune_min_numel": 0},
}


def _bool(name):
    def conv(v):
        if not isinstance(v, bool):
            raise TypeError(f"option {name!r} takes a bool, not {v!r}")
        return v
    return conv


def _int(name, low=0):
    def conv(v):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise TypeError(f"option {name!r} takes an int >= {low}, not {v!r}")
        return v
    return conv


def _choice(name, choices):
    def conv(v):
        if v not in choices:
            raise ValueError(f"option {name!r} takes one of {', '.join(map(repr, choices))}, "
                             f"not {v!r}")
        return v
    return conv


def _cudagraphs(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    return _choice("cudagraphs", ("auto", "0", "1"))(v)


def _pad_mm(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    return _choice("pad_mm", ("0", "1", "always"))(v)


def _max_autotune(v):
    return 0 if _bool("max_autotune")(v) else config.autotune_min_numel


#: option name -> (kiln.config setting, converter of the user's value)
OPTIONS = {
    "cudagraphs": ("cudagraphs", _cudagraphs),
    "triton.cudagraphs": ("cudagraphs", _cudagraphs),
    "max_autotune": ("autotune_min_numel", _max_autotune),
    "autotune_min_numel": ("autotune_min_numel", _int("autotune_min_numel")),
    "fallback_random": ("fallback_random", _bool("fallback_random")),
    "graph_cache": ("graph_cache", _bool("graph_cache")),
    "partition_recompute": ("partition_recompute", _bool("partition_recompute")),
    "matmul_epilogue": ("matmul_epilogue",
                        _choice("matmul_epilogue", ("off", "background", "sync"))),
    "small_matmul_macs": ("small_matmul_macs", _int("small_matmul_macs")),
    "shape_padding": ("pad_mm", _pad_mm),
    "pad_mm": ("pad_mm", _pad_mm),
    "kernel_target": ("kernel_target", _choice("kernel_target", ("auto", "cpp", "triton"))),
    "compile_threads": ("compile_threads", _int("compile_threads", 1)),
    "recompile_limit": ("recompile_limit", _int("recompile_limit", 1)),
    "perf_fallback": ("perf_fallback", _bool("perf_fallback")),
}


def list_options() -> list[str]:
    """The names ``kiln.compile(options=...)`` accepts."""
    names = set(OPTIONS)
    if hasattr(config, "trace_dir"):
        names.add("trace_dir")
    return sorted(names)


def settings_for(mode, options) -> dict:
    """The kiln.config settings ``mode``/``options`` stand for; raises on anything kiln
    does not implement."""
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be "
                           "specified at the same time.")
    if options is None:
        mode = "default" if mode is None else mode
        if mode not in MODES:
            raise ValueError(f"kiln.compile: unknown mode {mode!r}; valid modes: "
                             f"{', '.join(map(repr, MODES))}")
        return dict(MODES[mode])
    if not isinstance(options, dict):
        raise TypeError(f"kiln.compile: options must be a dict, not {type(options).__name__}")
    out = {}
    for name, value in options.items():
        if name == "trace_dir" and hasattr(config, "trace_dir"):
            out["trace_dir"] = value
            continue
        if name not in OPTIONS:
            close = difflib.get_close_matches(str(name), list_options(), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"kiln.compile: unknown option {name!r}{hint} "
                             f"(kiln.list_options() lists the options kiln implements)")
        setting, conv = OPTIONS[name]
        out[setting] = conv(value)
    return out


class ConfiguredFunction(CompiledFunction):
    """A compiled function whose calls run with ``settings`` patched into kiln.config."""

    def __init__(self, *args, settings: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = settings

    def __call__(self, *args, **kwargs):
        with config.overlay(self.settings):
            return CompiledFunction.__call__(self, *args, **kwargs)
