"""A hand-written attention block that builds its causal mask on the CPU inside forward (``torch.ones`` without
``device=``), as a new user's transformer block did: on the meta device ``masked_fill`` raises "Tensor on device meta
is not on the expected device cpu!"."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        t = x.shape[1]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


def get_inputs():
    return [torch.randn(2, 16, 32)]


def get_init_inputs():
    return []
