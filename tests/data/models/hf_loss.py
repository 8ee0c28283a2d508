"""What the transformers test models share: the causal-LM loss as the model's one output, and token inputs.

Not a model file itself (no ``get_model``): the ``hf_*_loss.py`` files beside it import it (``load_model`` puts a
model file's folder on ``sys.path`` while it imports the file).
"""

import torch


class WithLoss(torch.nn.Module):
    """A transformers causal LM returning only its loss from ``labels``: a scalar for ``apply --backward``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        return self.model(input_ids=input_ids, labels=labels).loss


def token_pair(vocab: int, shape: tuple[int, int]) -> list[torch.Tensor]:
    """``[input_ids, labels]``, int64 token ids of ``shape`` below ``vocab``, from a generator seeded with 1."""
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, shape, generator=g), torch.randint(0, vocab, shape, generator=g)]
