"""Fixture reference for aliases_input.py: a transpose that returns a new contiguous tensor."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.t().contiguous()


rows = 48
cols = 80


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
