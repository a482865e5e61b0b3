"""Tiny models for the distributed tests (built identically on every rank)."""
from __future__ import annotations

import torch
import torch.nn as nn

WIDTH = 32
#: one bias-free Linear(32, 32) weight per bucket: 4096 bytes
BUCKET_MB = WIDTH * WIDTH * 4 / 2**20


def chain(seed: int = 0, layers: int = 4) -> nn.Module:
    """Linear layers whose weights fill one bucket each at BUCKET_MB."""
    torch.manual_seed(seed)
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(WIDTH, WIDTH, bias=False), nn.ReLU())])


class Block(nn.Module):
    """A transformer-style block: norm, MLP, residual."""

    def __init__(self, dim: int = WIDTH):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, seed: int = 0, blocks: int = 3, dim: int = WIDTH):
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(8, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(blocks))
        self.out = nn.Linear(dim, 4)

    def forward(self, x):
        h = self.inp(x)
        for b in self.layers:
            h = b(h)
        return self.out(h)


def batch(rank: int, step: int, features: int = WIDTH) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, features, generator=g)


class Breaking(nn.Module):
    """Bucket-sized layers on both sides of a graph break (``.item()``)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Sequential(*[nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(2)])
        self.b = nn.Sequential(*[nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(2)])

    def forward(self, x):
        h = self.a(x)
        if h.sum().item() > 0:
            h = h * 2
        return self.b(h).relu()
