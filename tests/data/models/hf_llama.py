"""Hugging Face transformers' LlamaForCausalLM from a config (random weights, no download).

Realistic widths (hidden 4096, intermediate 11008, 32 heads, vocab 32000) with 2 layers, seq 2048: cheap on
--device meta, where nothing is allocated.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

CONFIG = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=2, num_attention_heads=32,
              num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, use_cache=False)
SEQ = 2048


def get_model():
    cfg = LlamaConfig(**CONFIG)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).to(torch.bfloat16)


def get_inputs():
    return [torch.randint(0, CONFIG["vocab_size"], (1, SEQ))]
