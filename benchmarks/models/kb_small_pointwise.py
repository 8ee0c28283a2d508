"""A launch-bound KernelBench-style problem: a chain of 12 pointwise ops on 4096 elements (ANCHORS.md's launch-bound
row), fp32. Every kernel is far shorter than its launch."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        for _ in range(3):
            x = torch.sigmoid(x * 1.5 + 0.25) - 0.1
        return x


def get_inputs():
    return [torch.randn(4096)]


def get_init_inputs():
    return []
