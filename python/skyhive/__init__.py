"""Skyhive for PyTorch: train on a swarm of unreliable machines.

skyhive.Optimizer wraps a torch.optim optimizer and averages the model with
the other peers of a run through the skyhive daemon (the Go binary);
skyhive.RemoteMixtureOfExperts is a mixture-of-experts layer whose experts
run on `skyhive server`s, called through the daemon.
skyhive.models holds PyTorch twins of Skyhive's registry models, which read
and write its checkpoints and average with Go peers; skyhive.data reads the
tokens `skyhive tokenize` writes; skyhive.checkpoint reads and writes
Skyhive's safetensors files; skyhive.experts holds expert modules for
`skyhive server --executor python`, whose executor is skyhive.executor."""

from .errors import (ConfigError, DaemonError, ExpertsError, NonFiniteError, SkyhiveError, StepError,
                     SwarmError)
from . import checkpoint, data, models
from .moe import RemoteMixtureOfExperts
from .optimizer import Optimizer

__all__ = ["Optimizer", "RemoteMixtureOfExperts", "SkyhiveError", "DaemonError", "ConfigError", "SwarmError",
           "NonFiniteError", "StepError", "ExpertsError", "checkpoint", "data", "models"]
__version__ = "0.1.0"
