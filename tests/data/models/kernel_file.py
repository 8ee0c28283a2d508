"""A kernel file with the contract kernel_fn / reference_fn / get_inputs: analyze looks at reference_fn."""

import torch


def reference_fn(x, w):
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return w * (x.float() * torch.rsqrt(variance + 1e-6)).to(x.dtype)


kernel_fn = reference_fn


def get_inputs():
    return [torch.randn(512, 1024), torch.ones(1024)]
