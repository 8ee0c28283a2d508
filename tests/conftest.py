"""Test configuration: run Triton kernels under the CPU interpreter when no GPU is present.

TRITON_INTERPRET must be set before triton is first imported, hence here at collection time.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    """Skip tests marked ``gpu`` on machines without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="GPU-only: needs CUDA (torch.compile of a triton_op cannot run under TRITON_INTERPRET)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
