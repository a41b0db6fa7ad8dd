"""The bridge's benchmark: python3 -m skyhive.bench [--quick].

Prints JSON lines in Skyhive's benchmark protocol (what `skyhive bench
pytorch` relays), each measured side by side with its reference in this run:

- step time of a convolutional network, where compute dominates, with
  skyhive.Optimizer and no peers over the bare torch.optim optimizer;
- the rate at which parameters and gradients cross into the daemon's shared
  memory (when they are not kept there) over the machine's memcpy rate,
  measured as a copy between two private tensors of the same size;
- with --pipeline, tokens/s of a GPT trained by `skyhive train pipeline`
  over 2 local workers that compute in PyTorch (--executor python), over
  its twin trained in this process on the same device;
- samples/s of an FFN expert (skyhive.experts:ffn) on a `skyhive server
  --executor python`, called through skyhive.RemoteMixtureOfExperts over
  loopback (forward, then backward: the server recomputes the forward pass
  and steps AdamW), over the same module doing the same work here, on the
  same device (--device; a GPU when there is one).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid

import torch

from .daemon import find_binary
from .experts import ffn
from .moe import RemoteMixtureOfExperts
from .optimizer import Optimizer

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def _start(args, ready=None, env=None, timeout=30):
    """Starts a skyhive command on loopback; returns it and its multiaddr
    once it printed it (and the line ready says, if any)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    addr, lines, found = [], [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if not addr and "/p2p/" in line and "127.0.0.1" in line:
                addr.append(line.strip().split()[-1])
            if addr and (ready is None or ready in line):
                found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(timeout):
        proc.kill()
        raise RuntimeError(f"skyhive {args[1]} did not start:\n" + "".join(lines[-20:]))
    return proc, addr[0]


def _dht(binary):
    return _start([binary, "dht", "--listen", "/ip4/127.0.0.1/tcp/0"])


def remote_expert(binary, reps, batch, hidden, device):
    """Samples/s of one expert served by a server's PyTorch executor and
    called through RemoteMixtureOfExperts (k_best 1: the layer's output is
    the expert's), over the same module doing the server's work here:
    forward, then forward + backward + AdamW step."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=pkg + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc, addr = _start([binary, "server", "--listen", "/ip4/127.0.0.1/tcp/0", "--experts", "ffn.[0:1]",
                         "--hidden", str(hidden), "--max-batch", str(batch), "--executor", "python",
                         "--python", sys.executable, "--module", "skyhive.experts:ffn", "--device", device,
                         "--stats-every", "0", "--declare-every", "1s"], ready="serving ", env=env, timeout=120)
    moe = None
    try:
        moe = RemoteMixtureOfExperts(in_features=hidden, grid_size=(1,), uid_prefix="ffn", dht=addr, k_best=1,
                                     max_rows=batch, forward_timeout=60, backward_timeout=60,
                                     listen=LOOPBACK).to(device)
        torch.manual_seed(1)
        local = ffn(hidden).to(device)
        opt = torch.optim.AdamW(local.parameters(), lr=1e-3, foreach=True)
        x, dy = torch.randn(batch, hidden, device=device), torch.randn(batch, hidden, device=device) * 0.01
        deadline = time.monotonic() + 60
        while True:  # until the expert's declaration is on the DHT
            try:
                moe(x).backward(dy)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

        def sync():
            if device.startswith("cuda"):
                torch.cuda.synchronize()

        def remote():
            moe(x).backward(dy)
            sync()

        def direct():
            with torch.no_grad():
                local(x)
            opt.zero_grad()
            local(x).backward(dy)
            opt.step()
            sync()

        direct()
        a, b = [], []
        for _ in range(reps):
            for fn, out in ((direct, a), (remote, b)):
                t0 = time.perf_counter()
                fn()
                out.append(batch / (time.perf_counter() - t0))
        return _line(f"remote-expert/h{hidden}/b{batch}", "samples/s", "samples/s", b, "direct", a,
                     f"skyhive.experts:ffn on {device}: through RemoteMixtureOfExperts, the daemon, libp2p on loopback, "
                     f"the server and its executor vs the module called here; alternating")
    finally:
        if moe is not None:
            moe.close()
        proc.terminate()
        proc.wait()


def _corpus(path):
    """A text file of the repository's Markdown (at most 300 kB), for the
    pipeline's tokenizer and batches."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parts = []
    for d, _, files in os.walk(root):
        if "/." in d or "node_modules" in d:
            continue
        for f in sorted(files):
            if f.endswith(".md"):
                with open(os.path.join(d, f), encoding="utf-8", errors="replace") as fh:
                    parts.append(fh.read())
    text = "\n".join(parts)[:300_000]
    if len(text) < 50_000:
        raise RuntimeError(f"only {len(text)} bytes of Markdown under {root} for the pipeline's text")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def pipeline_gpt(binary, device, layers, hidden, batch, micro, steps, workers=2):
    """Tokens/s of a GPT trained by `skyhive train pipeline` over local
    workers whose layers compute in PyTorch on device (--executor python),
    over the same model (its PyTorch twin, untied head) trained here with
    AdamW on batches of the same shape."""
    from . import models
    vocab, seq = 1024, 128
    spec = f"gpt:{layers}x{hidden}:{vocab}x{seq}"
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=pkg + os.pathsep + os.environ.get("PYTHONPATH", ""), SKYHIVE_PYTHON=sys.executable)
    corpus = f"/tmp/skyhive-bench-corpus-{os.getpid()}.txt"
    _corpus(corpus)
    try:
        out = subprocess.run([binary, "train", "pipeline", "--workers", str(workers), "--executor", "python",
                              "--device", device, "--model", spec, "--data", "text:" + corpus, "--vocab", str(vocab),
                              "--seq", str(seq), "--batch", str(batch), "--micro", str(micro), "--steps", str(steps),
                              "--replan-threshold", "0", "--eval-tokens", "4096", "--json"],
                             capture_output=True, text=True, env=env, timeout=480)
    finally:
        os.remove(corpus)
    if out.returncode != 0:
        raise RuntimeError("skyhive train pipeline failed:\n" + out.stderr[-3000:])
    res = json.loads(out.stdout)
    piped = res["iterations_run"] * batch * seq / res["seconds"]

    torch.manual_seed(1)
    model = models.build(spec, untied=True).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    ids = torch.randint(0, vocab, (batch, seq + 1), device=device)

    def step():
        opt.zero_grad()
        model.loss(ids[:, :-1], ids[:, 1:]).backward()
        opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    step()
    rates = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(10):
            step()
        rates.append(10 * batch * seq / (time.perf_counter() - t0))
    return _line(f"pipeline-gpt/{layers}x{hidden}/b{batch}", "tokens/s", "tokens/s", [piped], "direct", rates,
                 f"{spec} over {workers} local workers computing in PyTorch on {device} (skyhive train pipeline "
                 f"--executor python, micro-batches {micro}, {res['iterations_run']} iterations, profiling and "
                 f"planning not counted; plan {json.dumps(res.get('plan'))[:200]}) vs its twin trained here")


def _cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 8 * 8, 10))


def _summary(xs):
    return statistics.median(xs), min(xs), max(xs)


def _line(case, metric, unit, xs, baseline, bxs, note=""):
    v, lo, hi = _summary(xs)
    b = statistics.median(bxs)
    out = {"suite": "pytorch", "case": case, "metric": metric, "value": v, "unit": unit, "min": lo, "max": hi,
           "baseline": baseline, "baseline_value": b, "ratio": v / b if b else 0}
    if note:
        out["note"] = note
    return out


def step_overhead(dht, reps, steps, batch):
    """Seconds per step, skyhive.Optimizer (alone) vs the bare optimizer, alternating."""
    torch.manual_seed(1)
    bare_model, our_model = _cnn(), _cnn()
    our_model.load_state_dict(bare_model.state_dict())
    bare = torch.optim.SGD(bare_model.parameters(), lr=0.01, momentum=0.9)
    ours = Optimizer(our_model, optimizer=torch.optim.SGD(our_model.parameters(), lr=0.01, momentum=0.9), dht=dht,
                     run_id=f"bench-{uuid.uuid4().hex[:8]}", algo="local", period=1 << 30, min_peers=1, listen=LOOPBACK)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

    def run(model, opt):
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return (time.perf_counter() - t0) / steps

    run(bare_model, bare), run(our_model, ours)  # warm-up
    a, b = [], []
    for _ in range(reps):
        a.append(run(bare_model, bare))
        b.append(run(our_model, ours))
    ours.shutdown()
    params = sum(p.numel() for p in our_model.parameters())
    return _line("cnn-step", "step_time", "s", b, "bare torch.optim", a,
                 f"{params} parameters, batch {batch}, skyhive.Optimizer with no peers (algo local)")


def crossing(dht, reps, elements):
    """GB/s at which parameters and gradients enter the shared memory (copied,
    not kept there) vs a memcpy of the same bytes between private tensors."""
    p = torch.nn.Parameter(torch.randn(elements))
    p.grad = torch.randn(elements)
    opt = Optimizer([("w", p)], optimizer=torch.optim.SGD([p], lr=0.01), dht=dht,
                    run_id=f"bench-{uuid.uuid4().hex[:8]}", algo="local", min_peers=1, share_memory=False,
                    listen=LOOPBACK)
    src, dst = torch.randn(2 * elements), torch.empty(2 * elements)
    nbytes = 2 * elements * 4
    a, b = [], []
    opt._push(), dst.copy_(src)  # warm-up: the shared pages are touched once
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        a.append(nbytes / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        opt._push()
        b.append(nbytes / (time.perf_counter() - t0) / 1e9)
    opt.shutdown()
    return _line("crossing", "bandwidth", "GB/s", b, "memcpy", a,
                 f"{elements} parameters and their gradients into the shared memory")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m skyhive.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a shorter run (under 30 s)")
    ap.add_argument("--reps", type=int, default=7, help="measured repetitions of each (at least 5)")
    ap.add_argument("--binary", help="the skyhive binary (default $SKYHIVE_BIN or PATH)")
    ap.add_argument("--batches", type=int, nargs="+", help="the expert's batch sizes (default 64 256; 64 with --quick)")
    ap.add_argument("--pipeline", metavar="LAYERSxHIDDEN",
                    help="also train a GPT of this size by `skyhive train pipeline` over 2 local workers computing in "
                         "PyTorch on --device, against its twin trained here (e.g. 12x768)")
    ap.add_argument("--pipeline-batch", type=int, default=32, help="the pipeline's batch (sequences of 128 tokens)")
    ap.add_argument("--pipeline-steps", type=int, default=40, help="the pipeline's iterations")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the expert computes, here and on the server (default: a GPU when there is one)")
    a = ap.parse_args(argv)
    reps = max(a.reps, 5)
    binary = find_binary(a.binary)
    proc, dht = _dht(binary)
    try:
        for line in (step_overhead(dht, reps, 3 if a.quick else 8, 32),
                     crossing(dht, reps, (4 if a.quick else 16) << 20)):
            print(json.dumps(line), flush=True)
    finally:
        proc.terminate()
        proc.wait()
    for batch in a.batches or ((64,) if a.quick else (64, 256)):
        print(json.dumps(remote_expert(binary, reps, batch, 1024, a.device)), flush=True)
    if a.pipeline:
        layers, hidden = (int(v) for v in a.pipeline.split("x"))
        print(json.dumps(pipeline_gpt(binary, a.device, layers, hidden, a.pipeline_batch, 4, a.pipeline_steps)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
