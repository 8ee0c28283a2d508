"""A zoo of the transformers families users bring first, each built from the family's default config with only the
sizes shrunk (the cache left as the default config sets it), with inputs of the kind the family takes.

``build(name) -> (model, inputs)``; ``FAMILIES`` lists the names. Used by tests/test_zoo.py through model files of
the ``get_model`` convention (:func:`model_file_text`).
"""

from __future__ import annotations

import torch

#: Sizes every family is shrunk to (hidden, heads, layers, intermediate, vocabulary, tokens).
H, HEADS, LAYERS, INTER, VOCAB, SEQ = 32, 4, 2, 64, 128, 8

#: Size arguments shared by the decoder-only LMs (their default configs are kept otherwise).
_LM = dict(hidden_size=H, num_attention_heads=HEADS, num_hidden_layers=LAYERS, intermediate_size=INTER,
           vocab_size=VOCAB, max_position_embeddings=64)


def _ids(batch: int = 1, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(1))


def _lm(config_name: str, model_name: str, **extra) -> tuple[torch.nn.Module, list]:
    import transformers as tf

    cfg = getattr(tf, config_name)(**{**_LM, **extra})
    return getattr(tf, model_name)(cfg), [_ids()]


def _pixels(size: int = 32, channels: int = 3) -> torch.Tensor:
    return torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(2))


def _build(name: str) -> tuple[torch.nn.Module, list | dict]:
    import transformers as tf

    if name == "llama":
        return _lm("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2)
    if name == "mistral":
        return _lm("MistralConfig", "MistralForCausalLM", num_key_value_heads=2, sliding_window=4)
    if name == "mixtral":
        return _lm("MixtralConfig", "MixtralForCausalLM", num_key_value_heads=2, num_local_experts=4,
                   num_experts_per_tok=2)
    if name == "qwen2":
        return _lm("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2)
    if name == "qwen3":
        return _lm("Qwen3Config", "Qwen3ForCausalLM", num_key_value_heads=2, head_dim=8)
    if name == "gemma2":
        return _lm("Gemma2Config", "Gemma2ForCausalLM", num_key_value_heads=2, head_dim=8, sliding_window=4)
    if name == "gemma3":
        return _lm("Gemma3TextConfig", "Gemma3ForCausalLM", num_key_value_heads=2, head_dim=8, sliding_window=4)
    if name == "phi3":
        return _lm("Phi3Config", "Phi3ForCausalLM", num_key_value_heads=2, pad_token_id=0)
    if name == "gpt2":
        cfg = tf.GPT2Config(n_embd=H, n_head=HEADS, n_layer=LAYERS, vocab_size=VOCAB, n_positions=64)
        return tf.GPT2LMHeadModel(cfg), [_ids()]
    if name == "gpt_neox":
        return _lm("GPTNeoXConfig", "GPTNeoXForCausalLM")
    if name == "falcon":
        cfg = tf.FalconConfig(hidden_size=H, num_attention_heads=HEADS, num_hidden_layers=LAYERS, vocab_size=VOCAB)
        return tf.FalconForCausalLM(cfg), [_ids()]
    if name in ("bert", "roberta"):
        cls = {"bert": ("BertConfig", "BertModel"), "roberta": ("RobertaConfig", "RobertaModel")}[name]
        cfg = getattr(tf, cls[0])(hidden_size=H, num_attention_heads=HEADS, num_hidden_layers=LAYERS,
                                  intermediate_size=INTER, vocab_size=VOCAB, max_position_embeddings=64)
        return getattr(tf, cls[1])(cfg), [_ids()]
    if name == "distilbert":
        cfg = tf.DistilBertConfig(dim=H, n_heads=HEADS, n_layers=LAYERS, hidden_dim=INTER, vocab_size=VOCAB,
                                  max_position_embeddings=64)
        return tf.DistilBertModel(cfg), [_ids()]
    if name == "t5":
        cfg = tf.T5Config(d_model=H, d_kv=8, d_ff=INTER, num_layers=LAYERS, num_heads=HEADS, vocab_size=VOCAB)
        return tf.T5ForConditionalGeneration(cfg), {"input_ids": _ids(), "decoder_input_ids": _ids(seq=4)}
    if name == "bart":
        cfg = tf.BartConfig(d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                            decoder_attention_heads=HEADS, encoder_ffn_dim=INTER, decoder_ffn_dim=INTER,
                            vocab_size=VOCAB, max_position_embeddings=64)
        return tf.BartForConditionalGeneration(cfg), {"input_ids": _ids(), "decoder_input_ids": _ids(seq=4)}
    if name == "whisper":
        cfg = tf.WhisperConfig(d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                               decoder_attention_heads=HEADS, encoder_ffn_dim=INTER, decoder_ffn_dim=INTER,
                               vocab_size=VOCAB, num_mel_bins=16, max_source_positions=16, max_target_positions=16,
                               pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
        feats = torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(3))
        return tf.WhisperForConditionalGeneration(cfg), {"input_features": feats, "decoder_input_ids": _ids(seq=4)}
    if name == "vit":
        cfg = tf.ViTConfig(hidden_size=H, num_attention_heads=HEADS, num_hidden_layers=LAYERS, intermediate_size=INTER,
                           image_size=32, patch_size=8)
        return tf.ViTModel(cfg), [_pixels()]
    if name == "clip":
        text = dict(hidden_size=H, num_attention_heads=HEADS, num_hidden_layers=LAYERS, intermediate_size=INTER,
                    vocab_size=VOCAB, max_position_embeddings=64)
        vision = dict(hidden_size=H, num_attention_heads=HEADS, num_hidden_layers=LAYERS, intermediate_size=INTER,
                      image_size=32, patch_size=8)
        cfg = tf.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
        return tf.CLIPModel(cfg), {"input_ids": _ids(), "pixel_values": _pixels()}
    if name == "swin":
        cfg = tf.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)
        return tf.SwinModel(cfg), [_pixels()]
    raise KeyError(f"unknown zoo family {name!r}; known: {', '.join(FAMILIES)}")


FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "gpt2", "gpt_neox", "falcon",
            "bert", "roberta", "distilbert", "t5", "bart", "whisper", "vit", "clip", "swin")


def build(name: str) -> tuple[torch.nn.Module, list | dict]:
    """The family's model (random weights, seeded) and example inputs."""
    torch.manual_seed(0)
    return _build(name)


def model_file_text(name: str) -> str:
    """A model file of the ``get_model`` convention for family ``name`` (imports this module from its folder)."""
    return (f"import sys\nsys.path.insert(0, {str(__file__.rsplit('/', 1)[0])!r})\nimport zoo\n\n"
            f"def get_model():\n    return zoo.build({name!r})[0]\n\n"
            f"def get_inputs():\n    return zoo.build({name!r})[1]\n")
