"""A tensor made on the CPU inside forward (``torch.zeros`` without ``device=``): it meets meta tensors there."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        acc = torch.zeros(8, 64)
        return torch.relu(self.fc(x)) + acc


def get_model():
    torch.manual_seed(0)
    return Model()


def get_inputs():
    return [torch.randn(8, 64)]
