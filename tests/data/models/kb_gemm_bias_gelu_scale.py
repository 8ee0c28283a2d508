"""A KernelBench level-2 style problem: Linear (GEMM + bias), GELU, scale, residual add, at transformer MLP size
(8192 tokens x 4096 -> 4096), fp32 as KernelBench ships its problems. ``FA_BENCH_SMOKE=1``: 64 x 64 -> 64."""

import os

import torch
import torch.nn as nn

SMOKE = os.environ.get("FA_BENCH_SMOKE") == "1"
ROWS, IN, OUT = (64, 64, 64) if SMOKE else (8192, 4096, 4096)


class Model(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        y = torch.nn.functional.gelu(self.linear(x)) * self.scale
        return y + x


def get_inputs():
    return [torch.randn(ROWS, IN)]


def get_init_inputs():
    return [IN, OUT, 0.5]
