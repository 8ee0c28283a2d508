"""The built-in Llama (fusion_advisor/models/llama.py) at toy sizes (hidden 64, 2 layers, vocab 256, 16 tokens,
fp32): small enough for `apply --verify` on a CPU, where the library kernels run in Triton's interpreter."""

import torch

from fusion_advisor.models.llama import LlamaConfig, get_inputs as _get_inputs, get_model as _get_model

CFG = LlamaConfig(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, vocab_size=256, seq_len=16,
                  dtype=torch.float32)


def get_model():
    torch.manual_seed(0)
    return _get_model(CFG)


def get_inputs():
    torch.manual_seed(1)
    return _get_inputs(CFG)
