"""Runs eagerly on CPU, but no capture method can trace it: dynamo is disabled on forward, and the numpy round
trip defeats torch.export and fx.symbolic_trace."""
import torch
import torch.nn as nn


class Model(nn.Module):
    @torch.compiler.disable
    def forward(self, x):
        return torch.from_numpy(x.numpy() * 2.0) + 1


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
