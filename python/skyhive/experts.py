"""Expert modules for `skyhive server --executor python --module ...`.

`skyhive.experts:ffn` is Learning@home's feed-forward expert, computed as
Skyhive's Go experts compute it; a user's own module function has the
same form: called with the hidden size, it returns a torch.nn.Module whose
output has its input's shape."""

from torch import nn


class FFN(nn.Module):
    """x + fc2(relu(fc1(ln(x)))) with inner size 4·hidden; parameter names
    match those of Skyhive's Go FFN expert (ln, ffn.fc1, ffn.fc2)."""

    def __init__(self, hidden):
        super().__init__()
        self.ln = nn.LayerNorm(hidden, eps=1e-5)
        self.ffn = nn.Sequential()
        self.ffn.add_module("fc1", nn.Linear(hidden, 4 * hidden))
        self.ffn.add_module("relu", nn.ReLU())
        self.ffn.add_module("fc2", nn.Linear(4 * hidden, hidden))

    def forward(self, x):
        return x + self.ffn(self.ln(x))


def ffn(hidden):
    """Learning@home's FFN expert of the given hidden size."""
    return FFN(hidden)
