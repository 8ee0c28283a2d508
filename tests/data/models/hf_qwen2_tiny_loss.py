"""transformers Qwen2ForCausalLM at toy sizes (hidden 64, 2 layers, GQA 4/2, vocab 256), SDPA attention, cache off,
returning its loss, with its norm weights spread as trained Qwen2 norms are (not ones): a weight that scales a
row's rounding error is where a swapped RMSNorm's gradient is checked hardest."""

import torch
from hf_loss import WithLoss, token_pair
from transformers import Qwen2Config, Qwen2ForCausalLM


def get_model():
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, use_cache=False)
    cfg._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 3 * torch.randn_like(p))
    return WithLoss(model)


def get_inputs():
    return token_pair(256, (2, 8))
