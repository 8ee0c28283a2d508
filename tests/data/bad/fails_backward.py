"""A model whose forward runs and whose backward raises (a custom op without an autograd formula, in spirit): apply
--backward must say the model fails its backward, not end in an internal error."""

import torch


class NoGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("no backward for NoGrad")


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return NoGrad.apply(self.lin(x)).relu()


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return []
