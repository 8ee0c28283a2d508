"""A model with a graph break: a Python print of a tensor value between two captured regions."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        x = torch.relu(self.lin(x))
        n = int(x.shape[0])
        torch._dynamo.graph_break()
        return torch.softmax(x * n, dim=-1)


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return []
