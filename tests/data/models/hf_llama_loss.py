"""hf_llama.py's model (transformers LlamaForCausalLM, 2 layers at Llama-2-7B widths, bf16, seq 2048) returning its
causal-LM loss from labels: the forward+backward case of ``apply --backward`` (benchmarks/apply/llama_h200.sh)."""

from hf_llama import CONFIG, SEQ
from hf_llama import get_model as _llama
from hf_loss import WithLoss, token_pair


def get_model():
    return WithLoss(_llama())


def get_inputs():
    return token_pair(CONFIG["vocab_size"], (1, SEQ))
