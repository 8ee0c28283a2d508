"""A small MLP block for profiling tests: GEMM, a pointwise epilogue chain, GEMM, residual add + LayerNorm, softmax.

Each op does tens of microseconds of work on a CPU, so per-op profiler ranges dominate over Python glue.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden, inner):
        super().__init__()
        self.up = nn.Linear(hidden, inner)
        self.down = nn.Linear(inner, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.up(x)) * 0.5 + 0.1
        y = self.norm(x + self.down(h))
        return torch.softmax(y * 2.0, dim=-1)


def get_inputs():
    return [torch.randn(128, 256)]


def get_init_inputs():
    return [256, 512]
