"""The built-in default model (``fusion_advisor.models.llama``: Llama-2-7B widths, seq 2048, bf16) with its layer
count from ``FUSION_ADVISOR_LLAMA_LAYERS`` (2 by default), as a get_model file.

``FA_BENCH_SMOKE=1`` (the accuracy benchmark's ``--smoke``): the same code at hidden 64, 1 layer, seq 32."""

import dataclasses
import os

from fusion_advisor.models import llama

SMOKE = os.environ.get("FA_BENCH_SMOKE") == "1"


def _config():
    cfg = llama.default_config()
    if SMOKE:
        cfg = dataclasses.replace(cfg, hidden_size=64, intermediate_size=172, num_heads=4, vocab_size=512, seq_len=32,
                                  num_layers=1)
    return cfg


def get_model():
    return llama.get_model(_config())


def get_inputs():
    return llama.get_inputs(_config())
