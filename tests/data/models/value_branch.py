"""Control flow on a tensor's value (``if h.mean() > 0``): nothing to branch on with meta tensors."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x):
        h = self.a(x)
        if h.mean() > 0:
            return self.b(h).relu()
        return h.tanh()


def get_model():
    torch.manual_seed(0)
    return Model()


def get_inputs():
    return [torch.randn(8, 16)]
