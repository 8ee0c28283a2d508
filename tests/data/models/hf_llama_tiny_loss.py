"""transformers LlamaForCausalLM at toy sizes (hidden 64, 1 layer, GQA 4/2, vocab 256), SDPA attention, cache off,
returning its loss: apply's swaps and whole-model checks on a real transformers decoder, on a CPU."""

import torch
from hf_loss import WithLoss, token_pair
from transformers import LlamaConfig, LlamaForCausalLM


def get_model():
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, use_cache=False)
    cfg._attn_implementation = "sdpa"
    return WithLoss(LlamaForCausalLM(cfg))


def get_inputs():
    return token_pair(256, (2, 8))
