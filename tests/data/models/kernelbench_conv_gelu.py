"""A KernelBench level-2 style problem: Conv2d, then a chain of pointwise ops and a softmax over channels."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, scale):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.scale = scale

    def forward(self, x):
        x = self.conv(x)
        x = torch.nn.functional.gelu(x) * self.scale
        x = x + 1.0
        return torch.softmax(x, dim=1)


batch_size, in_channels, out_channels, height, width, kernel_size = 16, 3, 16, 64, 64, 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, 0.5]
