"""A sparse mixture of experts written the usual way: router top-k, ``(idx == e).nonzero()``, gather, ``index_add_``
(the tokens each expert gets depend on the values: data-dependent sizes)."""

import torch
import torch.nn as nn


class MoE(nn.Module):
    def __init__(self, d: int = 32, experts: int = 4, k: int = 2):
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(experts))
        self.k = k

    def forward(self, x):
        w, idx = self.router(x).softmax(-1).topk(self.k, -1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            out.index_add_(0, rows, expert(x[rows]) * w[rows, slot, None])
        return out


def get_model():
    torch.manual_seed(0)
    return MoE()


def get_inputs():
    return [torch.randn(64, 32)]
