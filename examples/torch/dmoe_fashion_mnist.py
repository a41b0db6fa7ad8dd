"""A Fashion-MNIST classifier whose middle layer is a decentralized mixture
of experts: the experts are PyTorch modules on `skyhive server`s, the rest
of the model trains here.

    skyhive server --experts 'ffn.[0:4].[0:1]' --hidden 64 --executor python \\
        --module skyhive.experts:ffn            # prints ADDR; more servers with --dht ADDR
    python3 examples/torch/dmoe_fashion_mnist.py --dht ADDR --grid 4 4

The model is Linear(784, hidden) → ReLU → RemoteMixtureOfExperts (top
--k-best of the grid's experts, skyhive.experts:ffn on the servers) →
Linear(hidden, 10). The local layers and the gate train with AdamW here;
each expert trains on its server with the server's AdamW (--lr of `skyhive
server`). A server that dies is skipped: samples go on to the experts that
answer (k_min), and a batch no expert answered is skipped. JSON lines: the
evaluations (--eval-every) and the result.
"""

import argparse
import gzip
import json
import os
import time

import numpy as np
import torch

import skyhive

DATA = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


def load(kind, data_dir):
    """Images (N, 784) in [0, 1] and labels of the train or t10k set."""
    with gzip.open(os.path.join(data_dir, f"{kind}-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(os.path.join(data_dir, f"{kind}-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


class Classifier(torch.nn.Module):
    def __init__(self, hidden, moe):
        super().__init__()
        self.inp = torch.nn.Linear(784, hidden)
        self.moe = moe
        self.out = torch.nn.Linear(hidden, 10)

    def forward(self, x):
        return self.out(self.moe(torch.relu(self.inp(x))))


def emit(**kw):
    print(json.dumps(kw), flush=True)


@torch.no_grad()
def accuracy(model, x, y):
    model.eval()
    correct = sum((model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum().item() for i in range(0, len(x), 1000))
    model.train()
    return correct / len(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dht", required=True, action="append", help="multiaddr of a skyhive dht or server (repeatable)")
    ap.add_argument("--grid", type=int, nargs="+", default=[4, 4], help="the experts' grid size, e.g. 4 4 for ffn.[0:4].[0:4]")
    ap.add_argument("--uid-prefix", default="ffn")
    ap.add_argument("--hidden", type=int, default=64, help="the experts' hidden size (the servers' --hidden)")
    ap.add_argument("--k-best", type=int, default=4)
    ap.add_argument("--k-min", type=int, default=1)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW's learning rate of the local layers and the gate")
    ap.add_argument("--eval-every", type=int, default=0, help="evaluate on 2,000 test examples every this many steps")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-dir", default=DATA)
    ap.add_argument("--listen", action="append", help="multiaddr to listen on (default all interfaces)")
    a = ap.parse_args()

    x, y = load("train", a.data_dir)
    tx, ty = load("t10k", a.data_dir)
    torch.manual_seed(a.seed)
    moe = skyhive.RemoteMixtureOfExperts(in_features=a.hidden, grid_size=a.grid, uid_prefix=a.uid_prefix, dht=a.dht,
                                         k_best=a.k_best, k_min=a.k_min, listen=a.listen)
    model = Classifier(a.hidden, moe)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    g = torch.Generator().manual_seed(a.seed)
    per_epoch = len(x) // a.batch
    steps = int(a.epochs * per_epoch)
    t0, skipped = time.time(), 0
    for step in range(steps):
        if step % per_epoch == 0:
            order = torch.randperm(len(x), generator=g)
        i = order[(step % per_epoch) * a.batch:][:a.batch]
        opt.zero_grad()
        try:
            loss = torch.nn.functional.cross_entropy(model(x[i]), y[i])
            loss.backward()
        except skyhive.ExpertsError as e:  # no expert answered some sample: skip the batch
            skipped += 1
            emit(event="skipped", step=step, error=str(e)[:200])
            continue
        opt.step()
        if a.eval_every and (step + 1) % a.eval_every == 0:
            emit(event="eval", step=step + 1, loss=loss.item(), accuracy=accuracy(model, tx[:2000], ty[:2000]),
                 seconds=round(time.time() - t0, 1))
    acc = accuracy(model, tx, ty)
    moe.close()
    emit(event="result", steps=steps, skipped=skipped, seconds=round(time.time() - t0, 1), test_accuracy=acc)


if __name__ == "__main__":
    main()
