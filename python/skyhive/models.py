"""PyTorch twins of Skyhive's registry models (mlp, mlp-small and the GPTs).

A twin computes what the Go model computes, with the same parameters under
the same names, shapes and layouts (a linear layer's weight is [in, out],
the transpose of torch.nn.Linear's), in the same order. So a twin reads and
writes Skyhive's checkpoints, and a PyTorch peer training a twin averages
with Go peers of the same model (`skyhive peer --model SPEC`):
skyhive.Optimizer tells the daemon which registry model it trains.

Example::

    data = skyhive.data.Tokens("gcide-tokens")      # skyhive tokenize --out gcide-tokens
    model = skyhive.models.build("gpt-mini", data=data, seq=128)
    model = skyhive.models.load("lm.safetensors")    # skyhive train --checkpoint lm.safetensors
"""

import json
import math
import re

import torch
import torch.nn.functional as F
from torch import nn

from . import checkpoint
from .errors import ConfigError

# Bounds of GPT specs, as Skyhive's registry has them.
MAX_VOCAB, MAX_SEQ, MAX_LAYERS, MAX_HIDDEN, HEAD_DIM = 1 << 17, 4096, 128, 4096, 64
DEFAULT_SEQ = 128

# Named GPT sizes: (hidden, heads, layers, ffn, dropout).
_GPT_SIZES = {
    "gpt-mini": (128, 4, 4, 512, 0.0),
    "gpt-small": (768, 12, 12, 3072, 0.1),
    "gpt-medium": (1024, 16, 24, 4096, 0.1),
}
# Image classifiers: layer sizes and dropout.
_MLPS = {"mlp": ([784, 512, 256, 10], 0.1), "mlp-small": ([784, 128, 10], 0.0)}


class Linear(nn.Module):
    """x·W + b with W of shape [in, out] (Skyhive's layout)."""

    def __init__(self, n_in, n_out, std):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * std)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)


class LayerNorm(nn.Module):
    """Skyhive's LayerNorm: parameters gamma and beta, biased variance."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return F.layer_norm(x, self.gamma.shape, self.gamma, self.beta, self.eps)


class Table(nn.Module):
    """An embedding table, [rows, hidden], under the name weight."""

    def __init__(self, rows, hidden, std):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(rows, hidden) * std)


class Attention(nn.Module):
    """Causal multi-head self-attention: head h takes columns h·d…(h+1)·d−1
    of q, k and v."""

    def __init__(self, hidden, heads, std):
        super().__init__()
        self.heads = heads
        self.wq, self.wk, self.wv, self.wo = (Linear(hidden, hidden, std) for _ in range(4))

    def forward(self, x):
        b, s, h = x.shape
        d = h // self.heads

        def split(t):
            return t.view(b, s, self.heads, d).transpose(1, 2)

        q, k, v = split(self.wq(x)), split(self.wk(x)), split(self.wv(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        p = scores.masked_fill(causal, float("-inf")).softmax(-1)
        return self.wo((p @ v).transpose(1, 2).reshape(b, s, h))


class FFN(nn.Module):
    def __init__(self, hidden, inner, std):
        super().__init__()
        self.fc1, self.fc2 = Linear(hidden, inner, std), Linear(inner, hidden, std)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Decoder(nn.Module):
    """GPT-2's pre-LN block: h = x + attn(LN1(x)), y = h + ffn(LN2(h))."""

    def __init__(self, hidden, heads, ffn, dropout, std, resid):
        super().__init__()
        self.ln1 = LayerNorm(hidden)
        self.attn = Attention(hidden, heads, std)
        self.ln2 = LayerNorm(hidden)
        self.ffn = FFN(hidden, ffn, std)
        self.drop = nn.Dropout(dropout)
        with torch.no_grad():
            self.attn.wo.weight.mul_(resid)
            self.ffn.fc2.weight.mul_(resid)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.ffn(self.ln2(x)))


class _Twin(nn.Module):
    """What every twin has: skyhive_names, its parameters' Skyhive names
    in the order of parameters()."""

    def skyhive_parameters(self):
        """(Skyhive name, parameter) pairs in Skyhive's order."""
        return list(zip(self.skyhive_names, self.parameters()))


class GPT(_Twin):
    """The twin of Skyhive's GPT: ids [batch, seq] (seq ≤ config's) to
    next-token logits [batch, seq, vocab], with a head tied to the token
    table unless untied.

    spec is the registry spec ("gpt-mini:1024x128"); data_signature, if
    set, names the data it trains on (skyhive.data.Tokens.signature), which
    a peer averaging with Go peers needs."""

    def __init__(self, spec, vocab, seq, hidden, heads, layers, ffn, dropout=0.0, untied=False, data_signature=None):
        super().__init__()
        self.spec, self.data_signature = spec, data_signature
        self.config = dict(vocab=vocab, seq=seq, hidden=hidden, heads=heads, layers=layers, ffn=ffn, dropout=dropout)
        resid = 1 / math.sqrt(2 * max(layers, 1))
        self.embed = Table(vocab, hidden, 0.02)
        self.pos = Table(seq, hidden, 0.01)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Decoder(hidden, heads, ffn, dropout, 0.02, resid) for _ in range(layers))
        self.ln = LayerNorm(hidden)
        self.head = Table(vocab, hidden, 0.02) if untied else None
        names = ["0.embed.weight", "1.pos.weight"]
        for i in range(layers):
            p = f"{3 + i}.dec."
            names += [p + "ln1.gamma", p + "ln1.beta"]
            names += [f"{p}attn.{w}.{t}" for w in ("wq", "wk", "wv", "wo") for t in ("weight", "bias")]
            names += [p + "ln2.gamma", p + "ln2.beta"]
            names += [f"{p}ffn.{w}.{t}" for w in ("fc1", "fc2") for t in ("weight", "bias")]
        names += [f"{3 + layers}.ln.gamma", f"{3 + layers}.ln.beta"]
        if untied:
            names.append(f"{4 + layers}.head.weight")
        self.skyhive_names = names

    def forward(self, ids):
        s = ids.shape[-1]
        if s > self.config["seq"]:
            raise ConfigError(f"a sequence of {s} tokens is longer than the model's context of {self.config['seq']}")
        x = self.drop(self.embed.weight[ids] + self.pos.weight[:s])
        for blk in self.blocks:
            x = blk(x)
        x = self.ln(x)
        table = self.head.weight if self.head is not None else self.embed.weight
        return x @ table.t()

    def loss(self, ids, targets):
        """The mean next-token cross entropy, as Skyhive trains."""
        logits = self(ids)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def evaluate(self, ids, batch=32):
        """The mean next-token cross entropy (nats per token) on token ids,
        evaluated as Skyhive does: consecutive windows of the context, in
        eval mode. exp of it is the perplexity `skyhive train` prints."""
        from .data import windows
        was = self.training
        self.eval()
        total, n = 0.0, 0
        dev = next(self.parameters()).device
        for x, y in windows(ids, batch, self.config["seq"]):
            logits = self(x.to(dev)).float()
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.to(dev).reshape(-1), reduction="sum").item()
            n += y.numel()
        self.train(was)
        return total / n


class MLP(_Twin):
    """The twin of Skyhive's image MLPs: standardized images [batch, 784]
    to logits [batch, 10] (Linear+ReLU(+Dropout) layers, then a linear
    output layer)."""

    def __init__(self, spec):
        super().__init__()
        sizes, dropout = _MLPS[spec]
        self.spec, self.data_signature = spec, None
        layers, names = [], []
        i = 0
        for a, b in zip(sizes[:-2], sizes[1:-1]):
            layers += [Linear(a, b, math.sqrt(2 / a)), nn.ReLU()]
            names += [f"{i}.fc.weight", f"{i}.fc.bias"]
            i += 2
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
                i += 1
        a, b = sizes[-2], sizes[-1]
        layers.append(Linear(a, b, math.sqrt(2 / (a + b))))
        names += [f"{i}.out.weight", f"{i}.out.bias"]
        self.layers = nn.Sequential(*layers)
        self.skyhive_names = names

    def forward(self, x):
        return self.layers(x)


def parse(spec, vocab=None, seq=None):
    """The twin's class and arguments for a registry spec: "mlp",
    "mlp-small", "gpt-mini:VOCAB[xSEQ]" (likewise gpt-small, gpt-medium),
    "gpt:LAYERSxHIDDEN:VOCAB[xSEQ]", or a GPT's name alone with vocab (and
    seq) given. Returns (canonical spec, kwargs of GPT) or (spec, None) for
    an MLP."""
    if spec in _MLPS:
        return spec, None
    name, _, rest = spec.partition(":")
    if name == "gpt":
        m = re.fullmatch(r"(\d+)x(\d+):(.*)", rest)
        if not m:
            raise ConfigError(f"bad model spec {spec!r}: want gpt:LAYERSxHIDDEN:VOCAB[xSEQ]")
        layers, hidden, rest = int(m[1]), int(m[2]), m[3]
        if not (1 <= layers <= MAX_LAYERS and HEAD_DIM <= hidden <= MAX_HIDDEN and hidden % HEAD_DIM == 0):
            raise ConfigError(f"bad model spec {spec!r}: 1..{MAX_LAYERS} layers, hidden a multiple of {HEAD_DIM} up to {MAX_HIDDEN}")
        size = (hidden, hidden // HEAD_DIM, layers, 4 * hidden, 0.1)
        prefix = f"gpt:{layers}x{hidden}"
    elif name in _GPT_SIZES:
        size, prefix = _GPT_SIZES[name], name
    else:
        raise ConfigError(f"no twin of model {spec!r}: want mlp, mlp-small, gpt-mini, gpt-small, gpt-medium or gpt:LAYERSxHIDDEN")
    if rest:
        m = re.fullmatch(r"(\d+)(?:x(\d+))?", rest)
        if not m:
            raise ConfigError(f"bad model spec {spec!r}: want {prefix}:VOCAB[xSEQ]")
        v, s = int(m[1]), int(m[2]) if m[2] else DEFAULT_SEQ
        if vocab is not None and v < vocab:
            raise ConfigError(f"model {spec} has a vocabulary of {v}, the data {vocab}")
        if seq is not None and s != seq:
            raise ConfigError(f"model {spec} has a context of {s}, not {seq}")
        vocab, seq = v, s
    elif vocab is None:
        raise ConfigError(f"model {spec!r} needs its vocabulary: {spec}:VOCAB[xSEQ], or give data=")
    seq = seq or DEFAULT_SEQ
    if not (2 <= vocab <= MAX_VOCAB and 1 <= seq <= MAX_SEQ):
        raise ConfigError(f"bad model spec {spec!r}: vocabulary 2..{MAX_VOCAB}, context 1..{MAX_SEQ}")
    hidden, heads, layers, ffn, dropout = size
    return f"{prefix}:{vocab}x{seq}", dict(vocab=vocab, seq=seq, hidden=hidden, heads=heads, layers=layers, ffn=ffn, dropout=dropout)


def build(spec, data=None, seq=None, untied=False):
    """A freshly initialised twin of spec (see parse). For a GPT, data (a
    skyhive.data.Tokens) gives the vocabulary and the data signature.
    torch's generator draws the weights; to start from the weights a Go
    peer of --seed S starts from, give skyhive.Optimizer seed=S."""
    full, kw = parse(spec, vocab=data.vocab if data is not None else None, seq=seq)
    if kw is None:
        return MLP(full)
    return GPT(full, untied=untied, data_signature=data.signature if data is not None else None, **kw)


def load(path, map_location="cpu"):
    """The twin of the model in a Skyhive checkpoint, with its weights:
    a checkpoint of `skyhive train` (tensors model/NAME) or of `skyhive
    peer` (its state vector, the model first). A language model's twin
    gets the data signature of the checkpoint's tokenizer."""
    ck = checkpoint.load(path)
    meta = ck.meta
    sig = meta.get("skyhive.model", "")
    spec, _, rest = sig.partition("/")
    model = build(spec)
    if isinstance(model, GPT):
        data = rest.partition("/")[2] or _tokenizer_signature(meta.get("skyhive.tokenizer"))
        model.data_signature = data
    params = model.skyhive_parameters()
    if "state" in ck.tensors and "/" in sig:  # a peer's checkpoint
        flat, off = ck.tensors["state"].reshape(-1), 0
        values = {}
        for name, p in params:
            values[name] = flat[off:off + p.numel()].reshape(p.shape)
            off += p.numel()
    else:
        values = {n[len("model/"):]: t for n, t in ck.tensors.items() if n.startswith("model/")}
    with torch.no_grad():
        for name, p in params:
            v = values.get(name)
            if v is None or tuple(v.shape) != tuple(p.shape):
                raise checkpoint.CheckpointError(f"{path}: {spec} needs {name} of shape {list(p.shape)}, the file has "
                                                 f"{'none' if v is None else list(v.shape)}")
            p.copy_(torch.from_numpy(v))
    return model.to(map_location)


def _tokenizer_signature(tok_json):
    """The data signature of a tokenizer (FNV-1a 64 of its merges), as
    Skyhive computes it; "tokens" without one."""
    if not tok_json:
        return "tokens"
    h = 0xcbf29ce484222325
    for l, r in json.loads(tok_json)["merges"]:
        for c in f"{l},{r};".encode():
            h = ((h ^ c) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"bpe-{h:016x}"


def save(model, path, optimizer=None, step=0, data=None, seed=0):
    """Writes a GPT twin as a checkpoint of `skyhive train` that Skyhive
    loads and resumes (`skyhive train --model SPEC --data DATA --resume
    --checkpoint PATH`): model/NAME, the AdamW state optim/NAME.m and .v
    (from optimizer, a torch Adam or AdamW, else zeros), and the metadata;
    data (skyhive.data.Tokens) gives the data's name and tokenizer. An MLP
    twin is written with its tensors and model only."""
    params = model.skyhive_parameters()
    tensors = {"model/" + n: p.detach().float().cpu().numpy() for n, p in params}
    meta = {"skyhive.model": model.spec, "skyhive.seed": str(seed)}
    if isinstance(model, GPT):
        opt_step = 0
        for n, p in params:
            st = optimizer.state.get(p, {}) if optimizer is not None else {}
            for go, torch_name in (("m", "exp_avg"), ("v", "exp_avg_sq")):
                t = st.get(torch_name)
                tensors[f"optim/{n}.{go}"] = t.detach().float().cpu().numpy() if t is not None else torch.zeros(p.shape).numpy()
            if "step" in st:
                opt_step = int(st["step"])
        c = model.config
        meta.update({
            "skyhive.task": "language modeling",
            "skyhive.gpt": json.dumps({k: c[k] for k in ("vocab", "seq", "hidden", "heads", "layers", "ffn", "dropout")}),
            "skyhive.step": str(step), "skyhive.optim_step": str(opt_step), "skyhive.train_seconds": "0.000",
            "skyhive.data": data.data if data is not None else "",
        })
        if data is not None and data.meta.get("tokenizer"):
            meta["skyhive.tokenizer"] = json.dumps(data.meta["tokenizer"], separators=(",", ":"))
    else:
        meta["skyhive.task"] = "image classification"
    checkpoint.save(path, tensors, meta)
