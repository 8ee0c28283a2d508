"""Three blocks, each with a graph break: dynamo captures two graphs and runs each three times per forward."""

import torch, torch.nn as nn
class Block(nn.Module):
    def __init__(self):
        super().__init__(); self.a = nn.Linear(16, 16)
    def forward(self, x):
        y = torch.relu(self.a(x)) * 2
        torch._dynamo.graph_break()
        return torch.sigmoid(y) + x
class Model(nn.Module):
    def __init__(self):
        super().__init__(); self.blocks = nn.ModuleList(Block() for _ in range(3))
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x
def get_inputs(): return [torch.randn(8, 16)]
def get_init_inputs(): return []
