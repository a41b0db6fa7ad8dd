"""A peer joining a run late downloads the model and its optimizer's state
(AdamW's moments and step) from donors that agree."""

import threading
import time
import uuid

import torch

import models
import skyhive
from swarm import DHT, run_peers, binary


def test_late_joiner_downloads_model_and_adamw_state():
    binary()
    dht = DHT()
    try:
        run = f"test-join-{uuid.uuid4().hex[:8]}"
        cfg = dict(seed=7, data_seed=3, peers=2, steps=80, batch=8, lr=1e-2, optimizer="adamw", sleep=0.1,
                   dht=dht.addr, run_id=run, algo="wagma", options={"matchmaking_time": 0.5})
        out = {}
        founders = threading.Thread(target=lambda: out.update(r=run_peers([dict(cfg, rank=r) for r in range(2)])))
        founders.start()
        time.sleep(6)  # the founders have been training for a while
        torch.manual_seed(99)  # not the founders' initial weights
        model = models.small_mlp()
        inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
        opt = skyhive.Optimizer(model, optimizer=inner, dht=dht.addr, run_id=run, algo="wagma", min_peers=1,
                                min_agree=2, matchmaking_time=0.5, listen=["/ip4/127.0.0.1/tcp/0"])
        try:
            assert opt.donors == 2, opt.donors
            assert opt.round > 0
            for p in model.parameters():
                st = inner.state[p]
                assert float(st["step"]) > 0
                assert st["exp_avg"].abs().sum() > 0 and st["exp_avg_sq"].abs().sum() > 0
            # The downloaded model is the founders' (trained), not the seed-99 one.
            torch.manual_seed(99)
            fresh = models.small_mlp()
            assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), fresh.parameters()))
            x, y = models.batch(3, 0, 0, 8)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        finally:
            opt.shutdown()
        founders.join(120)
        assert len(out["r"]) == 2
    finally:
        dht.stop()
