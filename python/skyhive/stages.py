"""Pipeline stages in PyTorch: a registry model's layers in the order and
with the parameter names of Skyhive's Go model, so that a stage worker
(`skyhive worker --executor python`) computes layers [first, last) of the
model in PyTorch while the coordinator plans, moves and checkpoints them
as it does for Go workers.

layers(spec) is what the executor builds: a list of (module, names), one
entry per layer of the Go model, names being the layer's parameters'
Skyhive names in the order of module.parameters(). A GPT's layers are the
token table, the positions, the embedding dropout, the decoder blocks, the
final LayerNorm and the head, which the pipeline always unties from the
token table (the two live on different workers)."""

from torch import nn

from . import models


class _Tokens(nn.Module):
    """Layer 0 of a GPT: token ids (as floats, the pipeline's tensors) to
    their rows of the token table."""

    def __init__(self, table):
        super().__init__()
        self.table = table

    def forward(self, ids):
        return self.table.weight[ids.long()]


class _Positions(nn.Module):
    """Layer 1 of a GPT: adds the position table's first seq rows."""

    def __init__(self, table):
        super().__init__()
        self.table = table

    def forward(self, x):
        return x + self.table.weight[: x.shape[1]]


class _Head(nn.Module):
    """The last layer of a GPT: hidden states to logits over the vocabulary."""

    def __init__(self, table):
        super().__init__()
        self.table = table

    def forward(self, x):
        return x @ self.table.weight.t()


def layers(spec):
    """The layers of the registry model spec as the pipeline splits them:
    [(module, [Skyhive names of its parameters])], freshly initialised
    (the coordinator writes the weights it holds over them)."""
    full, kw = models.parse(spec)
    if kw is None:
        model = models.MLP(full)
        mods = list(model.layers)
    else:
        model = models.GPT(full, untied=True, **kw)
        mods = [_Tokens(model.embed), _Positions(model.pos), model.drop, *model.blocks, model.ln, _Head(model.head)]
    name_of = {id(p): n for n, p in model.skyhive_parameters()}
    return [(m, [name_of[id(p)] for p in m.parameters()]) for m in mods]
