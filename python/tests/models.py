"""The tests' model and data: a small MLP on seeded random batches."""

import torch


def small_mlp():
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(data_seed, step, rank, size):
    """Peer rank's batch of a step, the same in every process."""
    g = torch.Generator().manual_seed(data_seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(size, 12, generator=g)
    y = torch.randint(0, 4, (size,), generator=g)
    return x, y
