"""transformers LlamaForCausalLM from a config (random weights, no download): Llama-2-7B widths (hidden 4096,
intermediate 11008, 32 heads, vocab 32000), 2 layers, bf16, batch 1 x seq 2048, SDPA attention.

``FA_BENCH_SMOKE=1``: hidden 64, 2 layers, seq 32 (CPU tests of the benchmark script)."""

import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SMOKE = os.environ.get("FA_BENCH_SMOKE") == "1"
CONFIG = (dict(hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=4, vocab_size=512, max_position_embeddings=128, use_cache=False) if SMOKE else
          dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, use_cache=False))
BATCH, SEQ = (1, 32) if SMOKE else (1, 2048)


def get_model():
    torch.manual_seed(0)
    cfg = LlamaConfig(**CONFIG)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).to(torch.bfloat16)


def get_inputs():
    return [torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ))]
