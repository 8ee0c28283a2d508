"""Two nn.TransformerEncoderLayer(batch_first=True) layers in eval: the model the cost model's composite encoder
layer (fusion_advisor/analyze/composites.py) and its CUDA-graph rule were checked on end to end with
`fusion-advisor analyze` and `apply --verify` (benchmarks/results/h200/accuracy/reprofile/composites/encoder_apply.log;
the run used a copy of this file)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                                                dropout=0.0, batch_first=True) for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def get_inputs():
    return [torch.randn(4, 64, 256)]


def get_init_inputs():
    return []
