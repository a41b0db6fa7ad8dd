"""Bad input and failures raise exceptions that say what to do, and lose nothing."""

import os
import signal
import threading
import time
import uuid

import pytest
import torch

import models
from swarm import DHT, binary
import skyhive


@pytest.fixture(scope="module")
def dht():
    d = DHT()
    yield d.addr
    d.stop()


def alone(dht, model, **kw):
    """An optimizer that trains alone (one peer) over model."""
    binary()  # skips without the binary
    kw.setdefault("algo", "local")
    kw.setdefault("listen", ["/ip4/127.0.0.1/tcp/0"])
    return skyhive.Optimizer(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dht=dht,
                             run_id=f"test-{uuid.uuid4().hex[:8]}", min_peers=1, **kw)


def train_step(model, opt, step=0):
    x, y = models.batch(1, step, 0, 8)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def test_missing_binary():
    model = models.small_mlp()
    with pytest.raises(skyhive.DaemonError, match="binary"):
        skyhive.Optimizer(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dht=["x"],
                          binary="/nonexistent/skyhive")


def test_options_refused_with_reasons(dht):
    model = models.small_mlp()
    with pytest.raises(skyhive.ConfigError, match="lr"):
        alone(dht, model, lr=0.1)
    with pytest.raises(skyhive.ConfigError, match="sgd"):
        alone(dht, model, algo="sgd")
    with pytest.raises(skyhive.ConfigError, match="does not update"):
        skyhive.Optimizer(model, optimizer=torch.optim.SGD(models.small_mlp().parameters(), lr=0.1), dht=dht)


def test_nan_gradient_is_refused_and_training_goes_on(dht):
    torch.manual_seed(1)
    model = models.small_mlp()
    with alone(dht, model) as opt:
        train_step(model, opt)
        before = [p.detach().clone() for p in model.parameters()]
        next(model.parameters()).grad[0, 0] = float("nan")
        with pytest.raises(skyhive.NonFiniteError, match="NaN"):
            opt.step()
        for p, b in zip(model.parameters(), before):
            assert torch.equal(p.detach(), b)
        train_step(model, opt, 1)
        assert opt.stats["steps"] == 2


def test_killed_daemon_loses_nothing(dht):
    torch.manual_seed(1)
    model = models.small_mlp()
    opt = alone(dht, model)
    train_step(model, opt)
    before = [p.detach().clone() for p in model.parameters()]
    os.kill(opt._daemon.proc.pid, signal.SIGKILL)
    opt._daemon.proc.wait()
    with pytest.raises(skyhive.DaemonError, match="lost the daemon"):
        train_step(model, opt, 1)
    # The step never reached the daemon: the parameters are the last step's.
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach(), b)
    opt.shutdown()
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach(), b)


def test_low_precision_and_views(dht):
    """fp16 and bf16 parameters cross converted; the daemon averages float32."""
    torch.manual_seed(2)
    model = models.small_mlp()
    model[0].to(torch.bfloat16)
    model[2].to(torch.float16)
    opt = alone(dht, model, algo="allreduce")
    x, y = models.batch(1, 0, 0, 8)
    opt.zero_grad()
    # Computed in float32 (CPU PyTorch lacks fp16 matrix products); the
    # gradients reach the parameters in their own dtypes.
    lin = torch.nn.functional.linear
    h = torch.tanh(lin(x, model[0].weight.float(), model[0].bias.float()))
    out = lin(h, model[2].weight.float(), model[2].bias.float())
    torch.nn.functional.cross_entropy(out, y).backward()
    want = [(p.detach().float() - 0.1 * p.grad.float()) for p in model.parameters()]
    opt.step()
    for p, w in zip(model.parameters(), want):
        assert p.dtype in (torch.bfloat16, torch.float16)
        assert torch.allclose(p.detach().float(), w.to(p.dtype).float(), atol=1e-2)
    opt.shutdown()


def test_binary_too_old(tmp_path):
    old = tmp_path / "skyhive"
    old.write_text('#!/bin/sh\necho \'Error: unknown command "daemon" for "skyhive"\' >&2\nexit 1\n')
    old.chmod(0o755)
    model = models.small_mlp()
    with pytest.raises(skyhive.DaemonError, match="too old"):
        skyhive.Optimizer(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dht=["x"], binary=str(old))


def test_another_model_in_the_run_is_refused(dht):
    """Peers of one run must train the same model: the second to come is
    told at once, the first when its wait for peers ends."""
    binary()
    run = f"test-{uuid.uuid4().hex[:8]}"
    errors = {}

    def join(name, model):
        try:
            skyhive.Optimizer(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dht=dht, run_id=run,
                              min_peers=2, wait_peers=4, listen=["/ip4/127.0.0.1/tcp/0"]).shutdown()
        except skyhive.SkyhiveError as e:
            errors[name] = e

    first = threading.Thread(target=join, args=("first", models.small_mlp()))
    first.start()
    time.sleep(1.5)
    join("second", torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)))
    first.join(30)
    assert isinstance(errors.get("second"), skyhive.SwarmError) and "model" in str(errors["second"]), errors
    assert isinstance(errors.get("first"), skyhive.SwarmError), errors
