"""An ``__init__`` that reads tensor values (as KernelBench's Swin files do for drop-path rates: ``.item()`` of a
``torch.linspace``)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, depth: int = 4):
        super().__init__()
        self.rates = [x.item() for x in torch.linspace(0, 0.1, depth)]
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in self.rates)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu()
        return x


def get_model():
    return Model()


def get_inputs():
    return [torch.randn(8, 16)]
