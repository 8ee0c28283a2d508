"""Every kernel test starts from the same random state, so a failure reproduces with the same inputs."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
