"""Token data written by `skyhive tokenize`: the same tokens, split and
data signature as Skyhive's own language-model trainers, for a PyTorch
training loop."""

import json
import math
import os

import numpy as np
import torch

from .errors import ConfigError

# The add-k smoothings `skyhive train` tries for its bigram reference.
BIGRAM_KS = (0.01, 0.03, 0.1, 0.3, 1.0)


class Tokens:
    """The output directory of `skyhive tokenize`: train and val (numpy
    arrays of token ids), vocab, signature (the data signature a twin gives
    the daemon) and the tokenizer's merges.

    Example::

        data = skyhive.data.Tokens("gcide-tokens")
        x, y = data.batch(16, 128, generator)
    """

    def __init__(self, path):
        meta_path = os.path.join(path, "tokens.json")
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{meta_path} is missing: write the tokens with `skyhive tokenize --out {path}`") from None
        if meta.get("format") != "skyhive-tokens" or meta.get("version") != 1:
            raise ConfigError(f"{meta_path} is not version 1 of skyhive tokenize's format")
        self.meta = meta
        self.vocab, self.signature, self.data = int(meta["vocab"]), meta["data_signature"], meta["data"]
        dtype = {2: "<u2", 4: "<u4"}.get(meta["token_width"])
        if dtype is None:
            raise ConfigError(f"{meta_path}: token width {meta['token_width']} (want 2 or 4)")
        self.train = self._read(os.path.join(path, "train.bin"), dtype, meta["train_tokens"])
        self.val = self._read(os.path.join(path, "val.bin"), dtype, meta["val_tokens"])
        tok = meta.get("tokenizer")
        self.merges = [tuple(m) for m in tok["merges"]] if tok else None

    def _read(self, path, dtype, n):
        ids = np.fromfile(path, dtype=dtype)
        if len(ids) != n:
            raise ConfigError(f"{path} holds {len(ids)} tokens, tokens.json says {n}: write them again")
        if len(ids) and int(ids.max()) >= self.vocab:
            raise ConfigError(f"{path} has token id {int(ids.max())}, outside the vocabulary of {self.vocab}")
        return ids.astype(np.int64)

    def batch(self, batch, seq, generator=None):
        """A random training batch: inputs [batch, seq] and next-token
        targets [batch, seq], windows drawn uniformly from the training
        tokens with the torch generator."""
        if len(self.train) < seq + 1:
            raise ConfigError(f"{len(self.train)} training tokens are fewer than a context of {seq} + 1")
        starts = torch.randint(0, len(self.train) - seq, (batch,), generator=generator).numpy()
        idx = starts[:, None] + np.arange(seq + 1)[None, :]
        w = torch.from_numpy(self.train[idx])
        return w[:, :-1], w[:, 1:]

    def eval_ids(self, seq, eval_tokens=0):
        """The validation ids a model of context seq is evaluated on, as
        Skyhive cuts them (--eval-tokens): at most eval_tokens predicted
        tokens (0: all), then whole windows of seq."""
        ids = self.val
        if eval_tokens > 0 and len(ids) > eval_tokens + 1:
            ids = ids[:eval_tokens + 1]
        rows = (len(ids) - 1) // seq
        if rows < 1:
            raise ConfigError(f"{len(ids) - 1} evaluation tokens are fewer than a context of {seq}")
        return ids[:rows * seq + 1]

    def bigram_perplexity(self, ids):
        """The perplexity on ids of the best add-k count bigram of the
        training tokens: the reference `skyhive train` prints."""
        return min(bigram_perplexity(self.train, ids, self.vocab, k) for k in BIGRAM_KS)

    def decode(self, ids):
        """The text of token ids (the tokenizer's bytes, decoded as UTF-8
        with replacement)."""
        if self.merges is None:
            raise ConfigError("token data comes without its tokenizer: it cannot be decoded")
        pieces = [bytes([i]) for i in range(256)] + [b""] * len(self.merges)
        for i, (l, r) in enumerate(self.merges):
            pieces[256 + i] = pieces[l] + pieces[r]
        return b"".join(pieces[int(i)] for i in ids).decode("utf-8", "replace")


def windows(ids, batch, seq):
    """Consecutive windows of seq tokens of ids, batch at a time (inputs,
    targets), as Skyhive evaluates: every id but the first is a target
    once, except a tail shorter than seq."""
    rows = (len(ids) - 1) // seq
    for r in range(0, rows, batch):
        n = min(batch, rows - r)
        idx = (r + np.arange(n))[:, None] * seq + np.arange(seq + 1)[None, :]
        w = torch.from_numpy(np.asarray(ids)[idx])
        yield w[:, :-1], w[:, 1:]


def bigram_perplexity(train, ids, vocab, k):
    """The perplexity on ids (each predicted from the one before) of the
    add-k count bigram of train: P(b|a) = (count(a,b)+k)/(count(a)+k·vocab)."""
    train, ids = np.asarray(train, dtype=np.int64), np.asarray(ids, dtype=np.int64)
    pairs = train[:-1] * vocab + train[1:]
    keys, counts = np.unique(pairs, return_counts=True)
    frm = np.bincount(train[:-1], minlength=vocab).astype(np.float64)
    q = ids[:-1] * vocab + ids[1:]
    pos = np.searchsorted(keys, q)
    pos[pos == len(keys)] = 0
    c = np.where(keys[pos] == q, counts[pos], 0).astype(np.float64)
    nll = -np.log((c + k) / (frm[ids[:-1]] + k * vocab)).sum()
    return math.exp(nll / (len(ids) - 1))
