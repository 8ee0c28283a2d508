"""Hugging Face transformers' BertModel from a small config (random weights, no download)."""

import torch
from transformers import BertConfig, BertModel


def get_model():
    cfg = BertConfig(hidden_size=768, num_hidden_layers=2, num_attention_heads=12, intermediate_size=3072)
    return BertModel(cfg)


def get_inputs():
    return [torch.randint(0, 30522, (2, 128))]
