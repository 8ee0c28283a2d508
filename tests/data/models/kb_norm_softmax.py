"""A KernelBench level-2 style problem without a GEMM: residual add + LayerNorm, scale, softmax over a wide row,
(4096 rows x 8192 columns), fp32. ``FA_BENCH_SMOKE=1``: 16 x 64."""

import os

import torch
import torch.nn as nn

SMOKE = os.environ.get("FA_BENCH_SMOKE") == "1"
ROWS, COLS = (16, 64) if SMOKE else (4096, 8192)


class Model(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.norm = nn.LayerNorm(cols)

    def forward(self, x, residual):
        h = self.norm(x + residual)
        return torch.softmax(h * 0.125, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS), torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [COLS]
