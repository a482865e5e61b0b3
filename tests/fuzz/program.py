"""A generated program: one module's source text and what the runner needs to call it.

The source defines ``make_inputs(g, train=False, clone=False)`` (returns the
arguments, the base tensors they are views of, and the autograd leaves), ``prog(...)``
(the function under test) and whatever helpers, classes and ``G_*`` globals ``prog``
uses. ``graph_break`` is a free name the runner binds: a no-op for eager,
``kiln.graph_break`` for kiln, ``torch._dynamo.graph_break`` for torch.compile.
Each run loads the source into a fresh namespace, so every run starts from the same
module state.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import linecache
import os
import sys

import torch

#: Module-level imports every program starts with.
PREAMBLE = "import math\nimport torch\nimport torch.nn.functional as F\n"

#: Seeds of the torch.Generator that makes each call's inputs (call 1, call 2): the
#: second call gets fresh values of the same shapes.
INPUT_SEEDS = (1, 2)


def _no_break():
    """Eager stand-in for ``graph_break()``."""


@dataclasses.dataclass(frozen=True)
class Program:
    seed: int
    source: str
    #: How inputs are made in train mode: "leaf" (float bases are autograd leaves and
    #: the arguments are them or their views), "clone" (the arguments are views of
    #: clones of the leaves: needed when the program mutates its inputs), or None
    #: (eager itself fails in train mode: train runs are skipped).
    train_inputs: str | None = "leaf"
    #: Generator features the program uses (statistics, test selection).
    features: tuple[str, ...] = ()

    @property
    def uses_half(self) -> bool:
        """Whether any value may pass through float16/bfloat16 (looser comparison)."""
        return any(w in self.source for w in ("float16", "bfloat16", ".half()"))

    @property
    def filename(self) -> str:
        return f"<fuzz-{self.seed}>"

    def load(self, graph_break=_no_break) -> dict:
        """A fresh module namespace holding the program (``FUZZ_PROGRAM_FILES``: as a
        module imported from a file there, which kiln's capture cache can store)."""
        files = os.environ.get("FUZZ_PROGRAM_FILES")
        if files:
            return self._load_from_file(files, graph_break)
        lines = self.source.splitlines(True)
        linecache.cache[self.filename] = (len(self.source), None, lines, self.filename)
        ns = {"__name__": f"fuzzprog_{self.seed}", "graph_break": graph_break}
        exec(compile(self.source, self.filename, "exec"), ns)
        return ns

    def _load_from_file(self, folder: str, graph_break) -> dict:
        name = f"fuzzprog_{self.seed}"
        path = os.path.join(folder, name + ".py")
        os.makedirs(folder, exist_ok=True)
        try:
            with open(path) as f:
                same = f.read() == self.source
        except OSError:
            same = False
        if not same:          # rewritten only when it differs: its mtime stays the cache's
            with open(path + ".tmp", "w") as f:
                f.write(self.source)
            os.replace(path + ".tmp", path)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        module.graph_break = graph_break
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module.__dict__

    def inputs(self, ns: dict, call: int, train: bool):
        """(args, bases, leaves) for call ``call`` (0-based), fresh tensors."""
        g = torch.Generator().manual_seed(INPUT_SEEDS[call])
        clone = train and self.train_inputs == "clone"
        return ns["make_inputs"](g, train, clone)
