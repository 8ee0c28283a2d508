"""Built-in default model: a Llama-style decoder stack written in plain PyTorch.

RMSNorm, attention with rotary position embeddings (RoPE, Hugging Face rotate_half convention) through
``F.scaled_dot_product_attention``, a SwiGLU MLP, and an LM head with cross-entropy loss — the layers of
Llama 2 (Touvron et al., 2023) as Hugging Face's ``modeling_llama.py`` writes them, so the chains the
advisor finds here are the ones it finds in real Llama checkpoints.

Default sizes are Llama-2-7B's (hidden 4096, 32 heads of 128, intermediate 11008, vocab 32000) at a
sequence of 2048 tokens in bf16, with 2 layers (set ``FUSION_ADVISOR_LLAMA_LAYERS`` or use :func:`get_model`
with a config for more). Follows the ``get_model()`` + ``get_inputs()`` convention.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

MODEL_NAME = "llama-default"


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes of the decoder. ``dtype`` is the parameter and activation dtype."""

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_layers: int = 2
    num_heads: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    batch_size: int = 1
    seq_len: int = 2048
    dtype: torch.dtype = torch.bfloat16

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich, 2019), HF ``LlamaRMSNorm`` semantics.

    ``x: [..., hidden]`` in any float dtype; computes in fp32, casts back, then multiplies by ``weight``.
    """

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[-x2, x1]`` for ``x = [x1, x2]`` split on the last dim (HF rotate_half)."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin tables of RoPE (Su et al., 2021, RoFormer) for positions ``[batch, seq]``: ``[batch, seq, head_dim]``."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # freqs: [batch, seq, head_dim / 2]
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :].float()
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, seq, head_dim]
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class Attention(nn.Module):
    """Multi-head causal self-attention with RoPE; q, k, v: ``[batch, heads, seq, head_dim]``."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, h, bias=False)
        self.v_proj = nn.Linear(h, h, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        shape = (b, s, self.cfg.num_heads, self.cfg.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [batch, 1, seq, head_dim]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU feed-forward (Shazeer, 2020): ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: ``h = x + attn(norm(x)); out = h + mlp(norm(h))``."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaForCausalLM(nn.Module):
    """Decoder stack with LM head; ``forward(input_ids [batch, seq] int64, labels [batch, seq] int64) -> loss``.

    The loss is the mean next-token cross-entropy in fp32 over ``vocab_size`` classes, as HF computes it.
    """

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
        cos, sin = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, self.cfg.vocab_size), labels.view(-1))


def default_config() -> LlamaConfig:
    """The default sizes, with the layer count from ``FUSION_ADVISOR_LLAMA_LAYERS`` when set."""
    layers = int(os.environ.get("FUSION_ADVISOR_LLAMA_LAYERS", LlamaConfig.num_layers))
    return LlamaConfig(num_layers=layers)


def get_model(cfg: LlamaConfig | None = None) -> LlamaForCausalLM:
    """The decoder with ``cfg`` (default: :func:`default_config`), parameters in ``cfg.dtype``."""
    cfg = cfg or default_config()
    return LlamaForCausalLM(cfg).to(cfg.dtype)


def get_inputs(cfg: LlamaConfig | None = None) -> list[torch.Tensor]:
    """Random token ids and labels, each ``[batch, seq]`` int64 in ``[0, vocab)``."""
    cfg = cfg or default_config()
    shape = (cfg.batch_size, cfg.seq_len)
    return [torch.randint(0, cfg.vocab_size, shape), torch.randint(0, cfg.vocab_size, shape)]
