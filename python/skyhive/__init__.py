"""Skyhive for PyTorch: train on a swarm of unreliable machines.

skyhive.Optimizer wraps a torch.optim optimizer and averages the model with
the other peers of a run through the skyhive daemon (the Go binary)."""

from .errors import (ConfigError, DaemonError, NonFiniteError, SkyhiveError, StepError,
                     SwarmError)
from .optimizer import Optimizer

__all__ = ["Optimizer", "SkyhiveError", "DaemonError", "ConfigError", "SwarmError",
           "NonFiniteError", "StepError"]
__version__ = "0.1.0"
