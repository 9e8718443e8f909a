"""2D average pooling, kernel 3, stride 1, padding 1, count_include_pad=True: nn.AvgPool2d(3, 1, 1)(x)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.AvgPool2d(3, stride=1, padding=1)

    def forward(self, x):
        return self.pool(x)


batch_size = 16
channels = 32
height = 256
width = 256
cpu_sizes = {"batch_size": 2, "channels": 4, "height": 12, "width": 12}


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return []
