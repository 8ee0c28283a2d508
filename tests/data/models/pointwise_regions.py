"""Two pointwise blocks around a linear layer: Inductor fuses each block's twelve ops into one kernel (the
regions test's model; large enough that the fusion shows on a CPU, small enough to compile in seconds)."""

import torch
import torch.nn as nn


class Pointwise(nn.Module):
    """Twelve elementwise ops: one fused kernel under Inductor, twelve passes over memory eagerly."""

    def forward(self, x):
        for _ in range(4):
            x = torch.sigmoid(x * 1.5 + 0.25) - 0.1
        return x


class Model(nn.Module):
    def __init__(self, width: int = 256):
        super().__init__()
        self.pre = Pointwise()
        self.lin = nn.Linear(width, width)
        self.post = Pointwise()

    def forward(self, x):
        return self.post(self.lin(self.pre(x)))


def get_inputs():
    return [torch.randn(2048, 256)]


def get_init_inputs():
    return [256]
