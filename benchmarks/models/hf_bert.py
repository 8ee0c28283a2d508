"""transformers BertModel from a config (random weights, no download): BERT-base widths (hidden 768, 12 heads,
intermediate 3072), 4 layers, bf16, batch 16 x seq 512, SDPA attention.

``FA_BENCH_SMOKE=1``: hidden 64, 2 layers, batch 2 x seq 32."""

import os

import torch
from transformers import BertConfig, BertModel

SMOKE = os.environ.get("FA_BENCH_SMOKE") == "1"
CONFIG = (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, vocab_size=512)
          if SMOKE else
          dict(hidden_size=768, num_hidden_layers=4, num_attention_heads=12, intermediate_size=3072, vocab_size=30522))
BATCH, SEQ = (2, 32) if SMOKE else (16, 512)


def get_model():
    torch.manual_seed(0)
    cfg = BertConfig(**CONFIG)
    cfg._attn_implementation = "sdpa"
    return BertModel(cfg).to(torch.bfloat16)


def get_inputs():
    return [torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ))]
