"""Test configuration: run Triton kernels under the CPU interpreter when no GPU is present.

TRITON_INTERPRET must be set before triton is first imported, hence here at collection time.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    """Skip tests marked ``gpu`` on machines without CUDA, with the marker's own reason when it gives one
    (``@pytest.mark.gpu("why")``)."""
    if torch.cuda.is_available():
        return
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is not None:
            why = marker.args[0] if marker.args else ("a CUDA GPU: GPU timings, cuBLAS/cuDNN/SDPA paths, or Triton "
                                                      "kernels compiled rather than interpreted")
            item.add_marker(pytest.mark.skip(reason=f"GPU-only: needs {why}"))
