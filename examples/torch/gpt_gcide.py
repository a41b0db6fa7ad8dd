"""A GPT trained on GCIDE by a swarm of PyTorch processes (and Go peers)
through skyhive.

The model is the PyTorch twin of Skyhive's gpt-mini (skyhive.models), so Go
peers training the same model on the same data average with it. One process
per peer, on one machine or many:

    skyhive tokenize --data gcide --out gcide-tokens      # the tokens, once per machine
    skyhive dht --listen /ip4/0.0.0.0/tcp/4001            # prints ADDR
    python3 examples/torch/gpt_gcide.py --tokens gcide-tokens --dht ADDR   # on each PyTorch peer
    skyhive peer --dht ADDR --model gpt-mini --algo diloco --run-id gcide-torch   # a Go peer, if any

Every peer starts from the weights of --seed (a Go peer's --seed gives the
same), trains on its own random windows, averages as --algo says and prints
JSON lines: evaluations on the validation tokens (perplexity, and the count
bigram's as the reference) and its result. --checkpoint writes the model as a
checkpoint of `skyhive train`, which Skyhive evaluates, resumes and samples.
"""

import argparse
import json
import math
import os
import sys
import time

import torch

import skyhive
from skyhive import data, models


def emit(**kw):
    print(json.dumps(kw), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", required=True, help="directory that `skyhive tokenize --out` wrote")
    ap.add_argument("--dht", required=True, action="append", help="multiaddr of a skyhive dht or peer (repeatable)")
    ap.add_argument("--run-id", default="gcide-torch")
    ap.add_argument("--algo", default="diloco", help="wagma, allreduce, local, diloco or wa-diloco")
    ap.add_argument("--model", default="gpt-mini", help="gpt-mini, gpt-small, gpt-medium or gpt:LAYERSxHIDDEN")
    ap.add_argument("--min-peers", type=int, default=2, help="peers of the run, Go peers included")
    ap.add_argument("--inner-steps", type=int, default=100, help="diloco and wa-diloco: local steps between outer steps")
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds one averaging may take (averaging_timeout)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--seq", type=int, default=64, help="context length (skyhive peer's default)")
    ap.add_argument("--lr", type=float, default=3e-3, help="AdamW's peak learning rate, after --warmup steps")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip (0: none)")
    ap.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's, on matrices only")
    ap.add_argument("--seed", type=int, default=1, help="the initial weights (a Go peer's --seed) and the batches")
    ap.add_argument("--eval-every", type=int, default=0, help="evaluate every this many steps (0: at the end only)")
    ap.add_argument("--eval-tokens", type=int, default=0, help="validation tokens to evaluate (0: all)")
    ap.add_argument("--checkpoint", help="write the final model here, as a checkpoint of skyhive train")
    ap.add_argument("--listen", action="append", help="multiaddr to listen on (repeatable; default all interfaces, TCP and QUIC)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    tokens = data.Tokens(a.tokens)
    if tokens.meta["seed"] != a.seed:
        print(f"note: {a.tokens} was split with seed {tokens.meta['seed']}; Go peers of --seed {a.seed} evaluate on "
              f"other validation tokens (skyhive tokenize --seed {a.seed} gives theirs)", file=sys.stderr)
    model = models.build(a.model, data=tokens, seq=a.seq).to(a.device)
    matrices = [p for p in model.parameters() if p.dim() > 1]
    vectors = [p for p in model.parameters() if p.dim() <= 1]
    adamw = torch.optim.AdamW([{"params": matrices}, {"params": vectors, "weight_decay": 0.0}],
                              lr=a.lr, weight_decay=a.weight_decay)
    opt = skyhive.Optimizer(model, optimizer=adamw, dht=a.dht, run_id=a.run_id, algo=a.algo, seed=a.seed,
                            min_peers=a.min_peers, inner_steps=a.inner_steps, outer_lr=a.outer_lr,
                            outer_momentum=a.outer_momentum, averaging_timeout=a.timeout,
                            batch_size_per_step=a.batch, listen=a.listen)
    emit(event="started", model=model.spec, data=tokens.signature, pid=os.getpid(), daemon_pid=opt.daemon_pid,
         peer=opt.peer_id, model_signature=opt.model_signature)
    eval_ids = tokens.eval_ids(a.seq, a.eval_tokens)
    bigram = tokens.bigram_perplexity(eval_ids)

    def evaluate(step):
        ppl = math.exp(model.evaluate(eval_ids))
        emit(event="eval", step=step, perplexity=round(ppl, 3), bigram=round(bigram, 3), ratio=round(ppl / bigram, 4),
             time=time.time())
        return ppl

    warmup = torch.optim.lr_scheduler.LambdaLR(adamw, lambda s: min(1.0, (s + 1) / max(a.warmup, 1)))
    g = torch.Generator().manual_seed(a.seed * 1_000_003 + os.getpid())
    t0, longest = time.time(), 0.0
    for step in range(a.steps):
        x, y = tokens.batch(a.batch, a.seq, g)
        opt.zero_grad()
        loss = model.loss(x.to(a.device), y.to(a.device))
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        s0 = time.time()
        try:
            opt.step()
        except skyhive.StepError as e:  # a peer timed out: the local step was taken
            emit(event="step_error", step=step, error=str(e))
        longest = max(longest, time.time() - s0)
        warmup.step()
        if a.eval_every and (step + 1) % a.eval_every == 0 and step + 1 < a.steps:
            evaluate(step + 1)
    seconds = time.time() - t0
    opt.shutdown()
    ppl = evaluate(a.steps)
    if a.checkpoint:
        models.save(model, a.checkpoint, optimizer=adamw, step=a.steps, data=tokens, seed=a.seed)
    emit(event="result", algo=a.algo, steps=a.steps, seconds=round(seconds, 1),
         tokens_per_second=round(a.steps * a.batch * a.seq / seconds), perplexity=round(ppl, 3),
         bigram=round(bigram, 3), round=opt.round, max_step_seconds=round(longest, 3), stats=opt.stats)


if __name__ == "__main__":
    main()
