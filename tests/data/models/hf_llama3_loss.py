"""transformers LlamaForCausalLM shaped like Llama-3 in what matters to apply: grouped-query attention (4 query heads
over 2 key/value heads), a vocabulary over 65536 (one softmax row wider than a 64K block), a loss from labels;
tiny otherwise. Built from the default config (cache left on); forward+backward through apply --backward."""

import torch
from hf_loss import WithLoss, token_pair
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 70000


def get_model():
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64)
    return WithLoss(LlamaForCausalLM(cfg))


def get_inputs():
    return token_pair(VOCAB, (1, 8))
