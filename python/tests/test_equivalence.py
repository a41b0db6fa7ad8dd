"""Distributed averaging equals its single-process equivalent (separate
processes, each with its own daemon, on loopback)."""

import uuid

import pytest
import torch

import models
from swarm import DHT, run_peers

PEERS, STEPS, BATCH, LR = 4, 6, 8, 0.1


@pytest.fixture(scope="module")
def dht():
    d = DHT()
    yield d.addr
    d.stop()


def reference(momentum):
    """One process on the union of the peers' batches."""
    torch.manual_seed(7)
    model = models.small_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)
    for step in range(STEPS):
        xs, ys = zip(*(models.batch(3, step, r, BATCH) for r in range(PEERS)))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return [p.detach().reshape(-1) for p in model.parameters()]


def swarm(dht, algo, momentum=0.0, **options):
    """Runs the peers; a run in which a collective failed at some peer (it
    then averages without the member it lost, so the replicas part) is
    repeated once: the equivalence is about runs whose collectives all
    succeed."""
    for attempt in range(2):
        run = f"test-{algo}-{uuid.uuid4().hex[:8]}"
        cfgs = [dict(seed=7, data_seed=3, rank=r, peers=PEERS, steps=STEPS, batch=BATCH, lr=LR, momentum=momentum,
                     dht=dht, run_id=run, algo=algo, options=options) for r in range(PEERS)]
        results = run_peers(cfgs)
        if all(r["stats"]["failures"] == 0 for r in results):
            return results
        print(f"{algo}: a collective failed in attempt {attempt + 1}:", [r["stats"] for r in results])
    raise AssertionError(f"{algo}: collectives failed in both attempts: {[r['stats'] for r in results]}")


def assert_close(results, want, tol=1e-5):
    for r in results:
        got = [torch.tensor(p) for p in r["params"]]
        for g, w in zip(got, want):
            stats = [x["stats"] for x in results]
            assert torch.allclose(g, w, atol=tol, rtol=0), f"max difference {(g - w).abs().max():.3g}; stats {stats}"


def test_allreduce_equals_one_process_on_the_union(dht):
    results = swarm(dht, "allreduce", momentum=0.9)
    assert_close(results, reference(0.9))


def test_diloco_one_inner_step_equals_synchronous_averaging(dht):
    results = swarm(dht, "diloco", inner_steps=1, outer_lr=1.0, outer_momentum=0)
    assert_close(results, reference(0.0))


def test_wa_diloco_with_tau_1_and_one_group_equals_diloco(dht):
    outer = dict(inner_steps=2, outer_lr=0.7, outer_momentum=0.9)
    diloco = swarm(dht, "diloco", momentum=0.9, **outer)
    wa = swarm(dht, "wa-diloco", momentum=0.9, tau=1, group_size=PEERS, **outer)
    want = [torch.tensor(p) for p in diloco[0]["params"]]
    assert_close(diloco, want)
    assert_close(wa, want)
    # and the outer steps moved the model away from plain local training
    assert max((w - r).abs().max().item() for w, r in zip(want, reference(0.9))) > 1e-4
