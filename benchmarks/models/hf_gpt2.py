"""transformers GPT2LMHeadModel from a config (random weights, no download): GPT-2 medium widths (1024 wide,
16 heads, vocab 50257), 4 layers, bf16, batch 8 x seq 1024, SDPA attention.

``FA_BENCH_SMOKE=1``: 64 wide, 2 layers, batch 2 x seq 32."""

import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel

SMOKE = os.environ.get("FA_BENCH_SMOKE") == "1"
CONFIG = (dict(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=128, use_cache=False) if SMOKE else
          dict(n_embd=1024, n_layer=4, n_head=16, vocab_size=50257, n_positions=1024, use_cache=False))
BATCH, SEQ = (2, 32) if SMOKE else (8, 1024)


def get_model():
    torch.manual_seed(0)
    cfg = GPT2Config(**CONFIG)
    cfg._attn_implementation = "sdpa"
    return GPT2LMHeadModel(cfg).to(torch.bfloat16)


def get_inputs():
    return [torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ))]
