"""Expert modules for the executor's tests (python3 -m skyhive.executor)."""

import os
import time

import torch
from torch import nn

from skyhive.experts import FFN


def make_ffn(hidden):
    return FFN(hidden)


class _Faulty(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.hidden = hidden
        self.lin = nn.Linear(hidden, hidden)

    def forward(self, x):
        if self.hidden == 3:
            return torch.cat([x, x[..., :1]], dim=-1)  # the wrong shape
        if self.hidden == 5:
            return self.lin(x) * float("nan")
        if self.hidden == 7:
            time.sleep(3600)  # hangs
        if self.hidden == 9:
            os._exit(3)  # crashes
        return self.lin(x)


def make_faulty(hidden):
    """A module whose fault depends on hidden: 3 returns the wrong shape,
    5 NaN, 7 hangs, 9 kills the executor; any other size is a Linear."""
    return _Faulty(hidden)


def not_a_module(hidden):
    return hidden
