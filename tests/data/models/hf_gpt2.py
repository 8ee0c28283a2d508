"""Hugging Face transformers' GPT2LMHeadModel from a small config (random weights, no download)."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def get_model():
    cfg = GPT2Config(n_embd=768, n_layer=2, n_head=12, vocab_size=50257, n_positions=1024, use_cache=False)
    return GPT2LMHeadModel(cfg)


def get_inputs():
    return [torch.randint(0, 50257, (2, 512))]
