"""skyhive.RemoteMixtureOfExperts against the same layer with its experts local."""

import time

import pytest
import torch

import skyhive
from skyhive.executor import expert_seed
from skyhive.experts import ffn

from swarm import Server

HIDDEN = 16
GRID = (4, 2)


def local_experts(seed=1):
    """The experts the servers build: skyhive.experts:ffn seeded from the
    seed and the UID."""
    out = {}
    for a in range(GRID[0]):
        for b in range(GRID[1]):
            uid = f"ffn.{a}.{b}"
            torch.manual_seed(expert_seed(seed, uid))
            out[(a, b)] = ffn(HIDDEN)
    return out


def local_layer(layer, experts, x, k):
    """The DMoE layer computed here: top-k experts by the sum of their
    coordinates' scores, softmax weights over them."""
    logits = layer.proj(x)
    rows = []
    for i in range(x.shape[0]):
        scored = sorted(((logits[i, a] + logits[i, GRID[0] + b], (a, b)) for (a, b) in experts),
                        key=lambda t: -t[0].item())[:k]
        w = torch.softmax(torch.stack([s for s, _ in scored]), dim=0)
        rows.append(sum(w[j] * experts[c](x[i:i + 1])[0] for j, (_, c) in enumerate(scored)))
    return torch.stack(rows)


@pytest.fixture(scope="module")
def servers():
    first = Server("ffn.[0:2].[0:2]", HIDDEN)
    second = Server("ffn.[2:4].[0:2]", HIDDEN, dht=first.addr)
    yield first, second
    second.stop()
    first.stop()


def test_remote_equals_local(servers):
    first, _ = servers
    torch.manual_seed(0)
    layer = skyhive.RemoteMixtureOfExperts(in_features=HIDDEN, grid_size=GRID, uid_prefix="ffn.", dht=first.addr,
                                           k_best=3, forward_timeout=30, backward_timeout=30)
    try:
        experts = local_experts()
        x = torch.randn(6, HIDDEN)
        # Until both servers' declarations are on the DHT, the beam search
        # sees only some experts.
        deadline = time.monotonic() + 60
        while True:
            with torch.no_grad():
                y, want = layer(x), local_layer(layer, experts, x, 3)
            if torch.allclose(y, want, atol=1e-5, rtol=1e-5) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)

        xr = x.clone().requires_grad_()
        xl = x.clone().requires_grad_()
        g = torch.randn(6, HIDDEN)
        (layer(xr) * g).sum().backward()
        remote_proj = [p.grad.clone() for p in layer.proj.parameters()]
        layer.proj.zero_grad()
        (local_layer(layer, experts, xl, 3) * g).sum().backward()
        torch.testing.assert_close(xr.grad, xl.grad, atol=1e-5, rtol=1e-5)
        for r, p in zip(remote_proj, layer.proj.parameters()):
            torch.testing.assert_close(r, p.grad, atol=1e-5, rtol=1e-5)
    finally:
        layer.close()


def test_dead_server_is_skipped():
    """A server killed between steps: the layer goes on with the experts
    that answer (k_min 1); with every server dead it raises ExpertsError."""
    a = Server("ffn.[0:1].[0:2]", HIDDEN, seed=2)
    b = Server("ffn.[1:2].[0:2]", HIDDEN, dht=a.addr, seed=2)
    layer = None
    try:
        torch.manual_seed(0)
        layer = skyhive.RemoteMixtureOfExperts(in_features=HIDDEN, grid_size=(2, 2), uid_prefix="ffn", dht=a.addr,
                                               k_best=4, k_min=1, forward_timeout=5, timeout_after_k_min=0.5,
                                               backward_timeout=5)
        x = torch.randn(8, HIDDEN)
        deadline = time.monotonic() + 60
        while True:  # until the four experts are declared
            layer(x).sum().backward()
            if bool((layer.answered == 4).all()) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert (layer.answered == 4).all()
        b.kill()
        for _ in range(3):
            layer.proj.zero_grad()
            y = layer(x)
            y.sum().backward()
            assert (layer.answered == 2).all()  # server a's two experts
            assert torch.isfinite(y).all()
            assert layer.proj.weight.grad is not None and torch.isfinite(layer.proj.weight.grad).all()
        a.kill()
        with pytest.raises(skyhive.ExpertsError):
            layer(x)
    finally:
        if layer is not None:
            layer.close()
        a.stop()
        b.stop()
