"""The modes a program is run under: kiln's backends, inference or training, and
torch.compile as a comparison peer (imported only when a torch mode runs)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    compiler: str  # "kiln" or "torch"
    backend: str
    train: bool


KILN_MODES = {
    "eager": Mode("eager", "kiln", "eager", False),
    "aot_eager": Mode("aot_eager", "kiln", "aot_eager", False),
    "kiln": Mode("kiln", "kiln", "kiln", False),
    "train": Mode("train", "kiln", "kiln", True),
    "train_aot_eager": Mode("train_aot_eager", "kiln", "aot_eager", True),
    "train_eager": Mode("train_eager", "kiln", "eager", True),
}


def torch_mode(train: bool, backend: str = "inductor") -> Mode:
    """torch.compile with ``backend``: named ``torch`` / ``torch_train`` for inductor,
    ``torch_<backend>`` / ``torch_train_<backend>`` otherwise."""
    name = "torch_train" if train else "torch"
    if backend != "inductor":
        name += f"_{backend}"
    return Mode(name, "torch", backend, train)


def lookup(name: str) -> Mode:
    if name in KILN_MODES:
        return KILN_MODES[name]
    if name.startswith("torch"):
        rest = name[len("torch"):]
        train = rest.startswith("_train")
        rest = rest[len("_train"):] if train else rest
        return torch_mode(train, rest.lstrip("_") or "inductor")
    raise ValueError(f"unknown mode {name!r}; kiln modes: {', '.join(KILN_MODES)}; torch[_train][_BACKEND]")


def torch_peer(mode: Mode, backend: str = "inductor") -> Mode:
    """The torch.compile mode a kiln mode is compared beside."""
    return torch_mode(mode.train, backend)


class Compiler:
    """graph_break, compile and reset of one compiler."""

    def __init__(self, mode: Mode):
        self.mode = mode
        if mode.compiler == "kiln":
            import kiln

            self.graph_break = kiln.graph_break
            self._compile = lambda fn: kiln.compile(fn, backend=mode.backend)
            self.reset = kiln.reset
        else:
            import torch
            import torch._dynamo

            self.graph_break = torch._dynamo.graph_break
            self._compile = lambda fn: torch.compile(fn, backend=mode.backend)
            self.reset = torch._dynamo.reset

    def compile(self, fn):
        return self._compile(fn)
