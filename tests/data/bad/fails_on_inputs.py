import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 16)

    def forward(self, x):
        return self.lin(x)  # x has 48 features: shape mismatch


def get_inputs():
    return [torch.randn(4, 48)]


def get_init_inputs():
    return []
