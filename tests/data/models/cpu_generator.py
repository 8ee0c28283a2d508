"""get_inputs() draws from an explicit CPU generator: inputs must still load on --device meta (and cuda)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


def get_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(64, 64, generator=g)]


def get_init_inputs():
    return []
