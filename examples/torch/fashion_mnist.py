"""A Fashion-MNIST CNN trained by a swarm of PyTorch processes through skyhive.

One process per peer, on one machine or many:

    skyhive dht --listen /ip4/0.0.0.0/tcp/4001          # prints ADDR
    python3 examples/torch/fashion_mnist.py --dht ADDR --peers 4 --rank 0   # and ranks 1..3

Each peer trains on every --peers-th example from --rank, averages with the
others as --algo says, and prints JSON lines: its evaluations on the test set
(every --eval-every steps, the first right after it joined) and its result.
A peer started later than the others (--min-peers 1) downloads the swarm's
model from --min-agree donors that agree.
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
    """Images (N, 1, 28, 28) in [0, 1] and labels of the train or t10k set."""
    with gzip.open(os.path.join(data_dir, f"{kind}-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(data_dir, f"{kind}-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


def cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 10))


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
    ap.add_argument("--dht", required=True, action="append", help="multiaddr of a skyhive dht or peer (repeatable)")
    ap.add_argument("--peers", type=int, default=4, help="data shards: this peer trains on every --peers-th example")
    ap.add_argument("--min-peers", type=int, help="peers to wait for before training (default --peers)")
    ap.add_argument("--min-agree", type=int, default=1, help="donors whose states must agree when joining late")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds one averaging may take (averaging_timeout)")
    ap.add_argument("--eval-every", type=int, default=0, help="evaluate every this many steps (0: at the end only)")
    ap.add_argument("--eval-examples", type=int, default=10000, help="test examples per evaluation during training (the last one takes all 10,000)")
    ap.add_argument("--rank", type=int, default=0, help="this peer's data shard, 0..peers-1")
    ap.add_argument("--run-id", default="fmnist-torch")
    ap.add_argument("--algo", default="wagma")
    ap.add_argument("--epochs", type=float, default=1.0, help="passes over this peer's shard")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05, help="SGD's learning rate (momentum 0.9), decayed to 0 along a cosine")
    ap.add_argument("--seed", type=int, default=1, help="seeds the initial weights (equal on every peer) and the batches")
    ap.add_argument("--data-dir", default=DATA)
    ap.add_argument("--listen", action="append", help="multiaddr to listen on (repeatable; default all interfaces, TCP and QUIC)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    x, y = load("train", a.data_dir)
    x, y = x[a.rank::a.peers], y[a.rank::a.peers]
    tx, ty = load("t10k", a.data_dir)
    tx, ty = tx.to(a.device), ty.to(a.device)
    ex, ey = tx[:a.eval_examples], ty[:a.eval_examples]  # the evaluations during training
    torch.manual_seed(a.seed)
    model = cnn().to(a.device)
    sgd = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    opt = skyhive.Optimizer(model, optimizer=sgd,
                            dht=a.dht, run_id=a.run_id, algo=a.algo, min_peers=a.min_peers or a.peers,
                            min_agree=a.min_agree, averaging_timeout=a.timeout, batch_size_per_step=a.batch,
                            listen=a.listen)
    emit(event="started", rank=a.rank, pid=os.getpid(), daemon_pid=opt.daemon_pid, peer=opt.peer_id)
    if opt.donors:
        emit(event="joined", rank=a.rank, donors=opt.donors, round=opt.round, time=time.time())
    if opt.donors or a.eval_every:
        emit(event="eval", rank=a.rank, step=0, accuracy=accuracy(model, ex, ey), time=time.time())
    g = torch.Generator().manual_seed(a.seed * 1000 + a.rank)
    steps = int(a.epochs * len(x) / a.batch)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(sgd, steps)
    t0, longest = time.time(), 0.0
    for step in range(steps):
        if step % (len(x) // a.batch) == 0:
            order = torch.randperm(len(x), generator=g)
        i = order[(step % (len(x) // a.batch)) * a.batch:][:a.batch]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[i].to(a.device)), y[i].to(a.device))
        loss.backward()
        s0 = time.time()
        try:
            opt.step()
        except skyhive.StepError as e:  # a peer timed out: the local step was taken
            emit(event="step_error", rank=a.rank, step=step, error=str(e))
        longest = max(longest, time.time() - s0)
        schedule.step()
        if a.eval_every and (step + 1) % a.eval_every == 0:
            emit(event="eval", rank=a.rank, step=step + 1, accuracy=accuracy(model, ex, ey), time=time.time())
    acc = accuracy(model, tx, ty)
    opt.shutdown()
    emit(event="result", rank=a.rank, algo=a.algo, steps=steps, seconds=round(time.time() - t0, 1),
         test_accuracy=acc, round=opt.round, max_step_seconds=longest, stats=opt.stats)


if __name__ == "__main__":
    main()
