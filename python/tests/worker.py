"""One PyTorch peer of a test: trains the test's model on its own seeded
batches with skyhive.Optimizer and prints its final parameters as JSON."""

import json
import sys
import time

import torch

import skyhive
import models

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]  # the tests' peers talk on loopback only


def main():
    c = json.loads(sys.argv[1])
    torch.manual_seed(c["seed"])
    model = models.small_mlp()
    if c.get("optimizer") == "adamw":
        inner = torch.optim.AdamW(model.parameters(), lr=c["lr"])
    else:
        inner = torch.optim.SGD(model.parameters(), lr=c["lr"], momentum=c.get("momentum", 0.0))
    opt = skyhive.Optimizer(model, optimizer=inner, dht=c["dht"], run_id=c["run_id"], algo=c["algo"],
                            min_peers=c["peers"], batch_size_per_step=c["batch"], listen=LOOPBACK,
                            **c.get("options", {}))
    for step in range(c["steps"]):
        x, y = models.batch(c["data_seed"], step, c["rank"], c["batch"])
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        time.sleep(c.get("sleep", 0))
    opt.shutdown()
    print(json.dumps({"params": [p.detach().reshape(-1).tolist() for p in model.parameters()],
                      "round": opt.round, "stats": opt.stats}))


if __name__ == "__main__":
    main()
