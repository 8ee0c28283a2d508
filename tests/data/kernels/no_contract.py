"""A kernel file without the contract: kernel_fn only, no reference_fn and no get_inputs (verify must refuse it)."""

import torch


def kernel_fn(x: torch.Tensor) -> torch.Tensor:
    return x * 2
