"""A Go `skyhive peer` and a PyTorch peer (the twin of gpt-mini, through the
daemon) train one model on GCIDE together and end with equal parameters."""

import json
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

from skyhive import models
from swarm import DHT, binary

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GCIDE = "/usr/share/dictd/gcide.dict.dz"
DATA = ["--corpus-bytes", "400000", "--vocab", "512"]
STEPS, INNER = 12, 4


def run_pair(dht, tmp_path):
    """Runs a Go peer and the PyTorch example in one run; returns the Go
    peer's JSON result and the example's events."""
    common = ["--run-id", f"mixed-{uuid.uuid4().hex[:8]}", "--algo", "diloco", "--inner-steps", str(INNER),
              "--steps", str(STEPS), "--batch", "8", "--seq", "32", "--seed", "5", "--outer-lr", "0.7",
              "--outer-momentum", "0.9", "--listen", "/ip4/127.0.0.1/tcp/0"]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), SKYHIVE_BIN=binary(), OMP_NUM_THREADS="1")
    procs = []
    try:
        procs.append(subprocess.Popen([binary(), "peer", "--dht", dht, "--model", "gpt-mini", "--data", "gcide", *DATA,
                                       "--checkpoint", str(tmp_path / "go.safetensors"), "--eval-tokens", "2000",
                                       "--json", "--quiet", *common],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        procs.append(subprocess.Popen([sys.executable, os.path.join(ROOT, "examples", "torch", "gpt_gcide.py"),
                                       "--tokens", str(tmp_path / "tokens"), "--dht", dht, "--eval-tokens", "2000",
                                       "--checkpoint", str(tmp_path / "torch.safetensors"), *common],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
        go_out, _ = procs[0].communicate(timeout=240)
        py_out, _ = procs[1].communicate(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[0].returncode == 0, go_out
    assert procs[1].returncode == 0, py_out
    go = json.loads(go_out[go_out.index("{"):])
    events = [json.loads(line) for line in py_out.splitlines() if line.startswith("{")]
    return go, events


def test_go_and_pytorch_peers_average_one_gpt(tmp_path):
    if not os.path.exists(GCIDE):
        pytest.skip(f"no GCIDE at {GCIDE}: run scripts/setup.sh (it installs dict-gcide)")
    subprocess.run([binary(), "tokenize", "--data", "gcide", *DATA, "--seed", "5", "--out", str(tmp_path / "tokens")],
                   check=True, capture_output=True, timeout=120)
    dht = DHT()
    try:
        # A run in which a collective failed at one peer (it then keeps its
        # own values for that part) is repeated once, as in the equivalence
        # tests: equality is about runs whose collectives all succeed.
        for attempt in range(2):
            go, events = run_pair(dht.addr, tmp_path)
            result = next(e for e in events if e["event"] == "result")
            if go["failures"] == 0 and result["stats"]["failures"] == 0:
                break
            print(f"attempt {attempt + 1}: a collective failed: go {go}, torch {result}")
    finally:
        dht.stop()
    started = next(e for e in events if e["event"] == "started")
    print(go, started, result, sep="\n")
    assert started["model_signature"].startswith("gpt-mini:512x32/"), started
    assert go["rounds"] == result["round"] == STEPS // INNER, (go, result)
    go_model = models.load(str(tmp_path / "go.safetensors"))
    py_model = models.load(str(tmp_path / "torch.safetensors"))
    init = models.build("gpt-mini:512x32")
    worst, moved = 0.0, 0.0
    for (n, a), (_, b) in zip(go_model.skyhive_parameters(), py_model.skyhive_parameters()):
        worst = max(worst, float(np.abs(a.detach().numpy() - b.detach().numpy()).max()))
    # Both took the same outer steps from the same start: equal to float precision.
    assert worst <= 1e-6, f"largest difference {worst}; go {go}; torch {result}"
    # The PyTorch peer's perplexity on the Go peer's evaluation tokens is the Go peer's
    # (it evaluates the same model).
    assert result["perplexity"] == pytest.approx(go["val_perplexity"], rel=5e-3), (go, result)
    assert go_model.config == init.config
