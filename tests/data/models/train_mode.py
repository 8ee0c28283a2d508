"""A model handed over in training mode with dropout and batch norm: analysed in eval mode, and the report says so."""

import torch
import torch.nn as nn


def get_model():
    return nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1)).train()


def get_inputs():
    return [torch.randn(32, 64)]
