"""A valid kernel file with the plain contract but no sweep hooks: ``bench --sweep`` must say what to add."""

import torch


def kernel_fn(x):
    return x * 2


def reference_fn(x):
    return x * 2


def get_inputs():
    return [torch.randn(10)]
