"""A model file (``get_model`` / ``get_inputs``) for ``fusion-advisor apply``: the Llama-3-8B-width training step of
issue 16 that ``lce_liger.py --parts llama`` times, built from the same config.

transformers ``LlamaForCausalLM`` at Llama-3-8B widths (hidden 4096, 4 layers, 32 query heads over 8 key/value
heads, intermediate 14336, vocabulary 128256, untied LM head, ``sdpa`` attention, no KV cache), bf16 weights, called
as ``(input_ids, labels) -> loss`` (the ``WithLoss`` convention of ``tests/data/models/hf_loss.py``) on 2 x 2048
tokens. A plan made on this file rebuilds on ``lce_liger.py``'s model (``--plan``): the swaps are keyed by module
path and source line, which both share.

    fusion-advisor apply benchmarks/kernels/llama3_8b_width_loss.py --verify --backward --device cuda --dtype bf16

``FUSION_ADVISOR_QUICK_LLAMA=1`` shrinks it (2 layers of hidden 64, vocabulary 512, 2 x 32 tokens) for a CPU smoke
test.
"""

from __future__ import annotations

import os

import torch

#: Llama-3-8B widths with 4 layers, and the batch; :data:`QUICK` for smoke tests.
FULL = dict(hidden_size=4096, num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8,
            intermediate_size=14336, vocab_size=128256, batch=2, seq=2048)
QUICK = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=512, batch=2, seq=32)


def sizes(quick: bool | None = None) -> dict[str, int]:
    """The widths and batch: :data:`QUICK` when ``quick`` (default: ``FUSION_ADVISOR_QUICK_LLAMA=1``), else
    :data:`FULL`."""
    if quick is None:
        quick = os.environ.get("FUSION_ADVISOR_QUICK_LLAMA", "") == "1"
    return dict(QUICK if quick else FULL)


def llama_config(quick: bool | None = None):
    """The ``LlamaConfig`` (untied LM head, ``sdpa`` attention, ``use_cache=False``)."""
    from transformers import LlamaConfig

    widths = sizes(quick)
    widths.pop("batch"), widths.pop("seq")
    return LlamaConfig(**widths, max_position_embeddings=4096, tie_word_embeddings=False, use_cache=False,
                       attn_implementation="sdpa")


class WithLoss(torch.nn.Module):
    """``(input_ids, labels) -> loss`` around a causal LM."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=labels).loss


def get_model() -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return WithLoss(LlamaForCausalLM(llama_config()).to(torch.bfloat16)).train()


def get_inputs() -> list[torch.Tensor]:
    """``[input_ids, labels]``, int64 ``[batch, seq]``, ``labels = input_ids`` (as lce_liger.py)."""
    s = sizes()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, s["vocab_size"], (s["batch"], s["seq"]), generator=gen)
    return [ids, ids.clone()]
