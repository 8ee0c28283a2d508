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


@pytest.fixture
def must_not_run(monkeypatch):
    """``must_not_run(target, what)``: replace ``target`` (``"module.attr"``, as ``monkeypatch.setattr`` takes it)
    with a function that fails the test when called: the long work an up-front check must refuse before."""
    def patch(target: str, what: str = "the work") -> None:
        def never(*args, **kwargs):
            raise AssertionError(f"{what} ran before the check")

        monkeypatch.setattr(target, never)

    return patch


@pytest.fixture
def read_only_folders(monkeypatch):
    """Every folder refuses a new entry, as a read-only mount or root's /proc does whatever its permission bits say
    (the probe of :func:`fusion_advisor.files.refuses_writes` fails)."""
    def refuse(*args, **kwargs):
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr("tempfile.mkdtemp", refuse)
