"""Exceptions of the skyhive package: each says what went wrong and what to do."""


class SkyhiveError(Exception):
    """Base class of every error this package raises."""


class DaemonError(SkyhiveError):
    """The daemon is missing, too old, could not start, or died; the
    connection to it is gone. The model's parameters are untouched."""


class ConfigError(SkyhiveError, ValueError):
    """An option, the model's description or the protocol version was refused."""


class SwarmError(SkyhiveError):
    """Joining the run failed: no DHT, too few peers, or peers training another model."""


class NonFiniteError(SkyhiveError, ValueError):
    """A parameter or gradient holds NaN or infinity; the step was not taken."""


class StepError(SkyhiveError):
    """The averaging of this step failed (a collective timed out); training can go on."""


class ExpertsError(SkyhiveError):
    """Too few experts answered: a sample got no answer in the forward pass
    (allow_zero_outputs=False), or fewer than backward_k_min gradients."""


KINDS = {
    "experts": ExpertsError,
    "config": ConfigError,
    "swarm": SwarmError,
    "value": NonFiniteError,
    "step": StepError,
    "protocol": DaemonError,
}
