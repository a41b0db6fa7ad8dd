"""skyhive.RemoteMixtureOfExperts: a mixture-of-experts layer whose experts
run on `skyhive server`s of the swarm (Learning@home's DMoE layer, with
hivemind's names)."""

import threading

import torch
from torch import nn

from .daemon import Daemon
from .errors import ConfigError, DaemonError
from .optimizer import _options
from .protocol import VERSION, Connection


class RemoteMixtureOfExperts(nn.Module):
    """A DMoE layer: a gating Linear scores each sample on every grid
    dimension; the daemon's beam search over the DHT picks the ``k_best``
    live experts with the highest scores (an expert's score is the sum of
    its coordinates' scores), calls them in parallel and waits until every
    sample has ``k_min`` answers, then ``timeout_after_k_min`` more seconds
    at most. The answers are averaged with softmax weights over the
    experts that answered. Backward sends each expert its input and the
    gradient of its answer (the server trains the expert), and
    differentiates the softmax weights into the gate here.

    Inputs are [batch, in_features] or [batch, seq, in_features] (the gate
    then sees the mean over the sequence); the output has the input's
    shape. After a forward pass, ``answered`` holds how many experts
    answered each sample. The experts are those `skyhive server --experts
    'PREFIX.[0:A].[0:B]'` hosts, of hidden size ``in_features``.

    Args:
        in_features: the experts' hidden size.
        grid_size: the grid's size per dimension, e.g. (4, 2).
        uid_prefix: the grid's prefix, e.g. "ffn" (a trailing "." is allowed).
        dht: multiaddrs of a `skyhive dht` node or of expert servers.
        k_best: experts per sample.
        k_min: answers per sample the forward pass waits for before
            timeout_after_k_min starts (1).
        forward_timeout, timeout_after_k_min, backward_timeout: seconds
            (None: 10, 1 and 10).
        backward_k_min: expert gradients per sample below which backward
            raises ExpertsError (1; 0: never).
        allow_zero_outputs: a sample no expert answered outputs zeros
            instead of raising ExpertsError.
        max_rows: the most samples of one call (1024).
        row_elements: elements of one sample, the largest (in_features;
            seq·in_features for [batch, seq, in_features] inputs).
        daemon: socket of a running `skyhive daemon` to use.
        binary: the skyhive binary (default $SKYHIVE_BIN or PATH).
        **options: the network options of `skyhive peer` (listen,
            swarm_secret, relay, ...), ``_`` for ``-``.
    """

    def __init__(self, *, in_features, grid_size, uid_prefix, dht, k_best, k_min=1, forward_timeout=None,
                 timeout_after_k_min=None, backward_k_min=1, backward_timeout=None, allow_zero_outputs=False,
                 max_rows=1024, row_elements=None, daemon=None, binary=None, **options):
        super().__init__()
        grid_size = tuple(int(s) for s in grid_size)
        if not grid_size or min(grid_size) < 1:
            raise ConfigError(f"grid_size {grid_size}: want positive sizes, e.g. (4, 2)")
        self.in_features, self.grid_size, self.k_best = int(in_features), grid_size, int(k_best)
        self.uid_prefix = uid_prefix.rstrip(".")
        self.allow_zero_outputs = allow_zero_outputs
        self.proj = nn.Linear(self.in_features, sum(grid_size))
        self.register_buffer("_offsets", torch.tensor([sum(grid_size[:d]) for d in range(len(grid_size))]),
                             persistent=False)
        self._row = int(row_elements or in_features)
        self._rows = int(max_rows)
        self._lock = threading.Lock()
        self._closed = False
        self._conn = None
        moe = {"uid_prefix": self.uid_prefix, "grid_size": list(grid_size), "in_features": self.in_features,
               "row_elements": self._row, "max_rows": self._rows, "k_best": self.k_best, "k_min": int(k_min),
               "backward_k_min": int(backward_k_min), "forward_timeout": float(forward_timeout or 0),
               "timeout_after_k_min": float(timeout_after_k_min or 0), "backward_timeout": float(backward_timeout or 0),
               "allow_zero_outputs": bool(allow_zero_outputs)}
        self._daemon = Daemon(socket=daemon, binary=binary)
        try:
            self._conn = Connection(self._daemon.socket, describe=self._daemon.describe)
            self._conn.send({"op": "hello", "version": VERSION, "mode": "moe", "moe": moe,
                             "options": _options(dict(options, dht=dht))})
            msg, self._mem = self._conn.shared_memory()
        except BaseException:
            self.close()
            raise
        self.peer = msg.get("peer")
        # answered: how many experts answered each sample of the last forward pass.
        self.answered = None
        self._buf = torch.frombuffer(self._mem, dtype=torch.float32)
        self._out = self._rows * self._row
        self._scores = self._out + self._rows * self.k_best * self._row

    def forward(self, x):
        if x.dim() not in (2, 3) or x.shape[-1] != self.in_features:
            raise ConfigError(f"input of shape {tuple(x.shape)}: want [batch, {self.in_features}] or "
                              f"[batch, seq, {self.in_features}]")
        gate_in = x if x.dim() == 2 else x.mean(dim=1)
        logits = self.proj(gate_in)
        dummy = torch.empty(0, requires_grad=True)  # the experts' backward runs even if x needs no gradient
        outs, coords, answered = _ExpertsCall.apply(self, torch.is_grad_enabled(), dummy, x, logits.detach())
        self.answered = answered.sum(dim=1)
        b, k, d = coords.shape
        idx = (coords + self._offsets).view(b, k * d)
        scores = logits.gather(1, idx).view(b, k, d).sum(-1)
        scores = scores.masked_fill(~answered, float("-inf"))
        weights = torch.softmax(scores, dim=1)
        weights = torch.where(answered, weights, torch.zeros_like(weights))  # rows with no answer: zeros, not NaN
        weights = weights.view(b, k, *([1] * (x.dim() - 1)))
        return (weights * outs).sum(dim=1)

    # --- the daemon's calls (one at a time) -----------------------------

    def _call(self, x, scores, keep):
        rows = x.shape[0]
        n = x.numel()
        if rows > self._rows or n // rows > self._row:
            raise ConfigError(f"input of shape {tuple(x.shape)}: at most max_rows={self._rows} samples of "
                              f"row_elements={self._row} elements each; make the layer with larger ones")
        with self._lock:
            self._check_open()
            self._buf[:n].copy_(x.reshape(-1))
            self._buf[self._scores:self._scores + scores.numel()].copy_(scores.reshape(-1))
            self._conn.send({"op": "moe_forward", "shape": list(x.shape), "keep": keep})
            msg = self._conn.recv()
            row = n // rows
            k = self.k_best
            outs = self._buf[self._out:self._out + rows * k * self._row].view(rows, k, self._row)[:, :, :row]
            outs = outs.reshape(rows, k, *x.shape[1:]).clone()
        d = len(self.grid_size)
        coords = torch.zeros(rows, k, d, dtype=torch.long)
        answered = torch.zeros(rows, k, dtype=torch.bool)
        for i, cs in enumerate(msg.get("coords") or []):
            for j, c in enumerate(cs[:k]):
                coords[i, j] = torch.tensor(c[:d])
                answered[i, j] = bool(msg["answered"][i][j])
        return outs, coords, answered, msg.get("call", 0)

    def _backward(self, call, grad_outs, shape):
        rows = grad_outs.shape[0]
        k = self.k_best
        row = grad_outs[0, 0].numel()
        with self._lock:
            self._check_open()
            region = self._buf[self._out:self._out + rows * k * self._row].view(rows, k, self._row)
            region[:, :, :row].copy_(grad_outs.reshape(rows, k, row))
            self._conn.send({"op": "moe_backward", "call": call})
            self._conn.recv()
            n = 1
            for s in shape:
                n *= s
            return self._buf[:n].view(*shape).clone()

    def _check_open(self):
        if self._closed:
            raise DaemonError("the layer is closed")

    def close(self):
        """Ends the daemon session (a daemon started for this layer exits)."""
        if self._closed:
            return
        self._closed = True
        if self._conn is not None:
            try:
                self._conn.send({"op": "close"})
                self._conn.recv()
            except DaemonError:
                pass
            self._conn.close()
        self._daemon.stop(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _ExpertsCall(torch.autograd.Function):
    """The experts' answers [batch, k, ...] for x, differentiable in x (and
    in the experts, whose servers take the gradients of their answers)."""

    @staticmethod
    def forward(ctx, layer, keep, dummy, x, scores):
        outs, coords, answered, call = layer._call(x.detach().float().cpu(), scores.float().cpu(), keep)
        ctx.layer, ctx.call, ctx.shape, ctx.device, ctx.dtype = layer, call, tuple(x.shape), x.device, x.dtype
        ctx.mark_non_differentiable(coords, answered)
        return outs.to(device=x.device, dtype=x.dtype), coords.to(x.device), answered.to(x.device)

    @staticmethod
    def backward(ctx, grad_outs, _coords, _answered):
        if not ctx.call:
            raise DaemonError("backward through a RemoteMixtureOfExperts pass made without gradients")
        dx = ctx.layer._backward(ctx.call, grad_outs.detach().float().cpu(), ctx.shape)
        return None, None, None, dx.to(device=ctx.device, dtype=ctx.dtype), None
