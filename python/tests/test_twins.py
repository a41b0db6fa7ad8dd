"""The PyTorch twins of Skyhive's models compute what Skyhive computes: a
checkpoint written by `skyhive train` evaluates to the numbers it printed,
and one written by a twin is resumed and evaluated by Skyhive."""

import gzip
import json
import math
import os
import re
import subprocess

import numpy as np
import pytest
import torch

import skyhive
from skyhive import checkpoint, data, models
from swarm import binary

GCIDE = "/usr/share/dictd/gcide.dict.dz"
FASHION = "/usr/share/datasets/fashion-mnist"
# A small corpus and model, so that Skyhive trains and evaluates in seconds.
LM = ["--data", "gcide", "--corpus-bytes", "400000", "--vocab", "512", "--seq", "32", "--batch", "8", "--sample-tokens", "0"]


def skyhive_cmd(*args, cwd):
    r = subprocess.run([binary(), *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"skyhive {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def printed(out):
    """The validation and bigram perplexities `skyhive train` printed."""
    m = re.search(r"validation perplexity ([\d.]+) \(loss ([\d.]+)\) on (\d+) tokens; bigram ([\d.]+)", out)
    assert m, out
    return float(m[1]), float(m[2]), int(m[3]), float(m[4])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A gpt-mini trained by `skyhive train`, and its tokens."""
    if not os.path.exists(GCIDE):
        pytest.skip(f"no GCIDE at {GCIDE}: run scripts/setup.sh (it installs dict-gcide)")
    d = tmp_path_factory.mktemp("lm")
    out = skyhive_cmd("train", "--model", "gpt-mini", *LM, "--steps", "25", "--checkpoint", "lm.safetensors", cwd=d)
    skyhive_cmd("tokenize", "--checkpoint", "lm.safetensors", "--corpus-bytes", "400000", "--out", "tokens", cwd=d)
    return d, printed(out)


def test_gpt_twin_evaluates_a_skyhive_checkpoint_to_the_perplexity_skyhive_printed(trained):
    d, (ppl, loss, n, bigram) = trained
    model = models.load(str(d / "lm.safetensors"))
    tokens = data.Tokens(str(d / "tokens"))
    assert model.spec == "gpt-mini:512x32"
    assert model.data_signature == tokens.signature and tokens.signature.startswith("bpe-")
    ids = tokens.eval_ids(model.config["seq"])
    assert len(ids) - 1 == n
    got = model.evaluate(ids, batch=8)
    print(f"skyhive: perplexity {ppl} (loss {loss}); twin: {math.exp(got):.4f} (loss {got:.6f})")
    assert abs(math.exp(got) / ppl - 1) < 0.005
    assert abs(got - loss) < 1e-3  # the printed loss has 4 decimals
    assert abs(tokens.bigram_perplexity(ids) / bigram - 1) < 1e-3


def test_a_twins_checkpoint_resumes_in_skyhive_with_the_twins_perplexity(trained, tmp_path):
    d, _ = trained
    tokens = data.Tokens(str(d / "tokens"))
    model = models.load(str(d / "lm.safetensors"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = tokens.batch(8, 32, g)
        opt.zero_grad()
        model.loss(x, y).backward()
        opt.step()
    path = tmp_path / "twin.safetensors"
    models.save(model, str(path), optimizer=opt, step=28, data=tokens)
    ck = checkpoint.load(str(path))
    assert ck.verified and ck.meta["skyhive.optim_step"] == "3"
    want = math.exp(model.evaluate(tokens.eval_ids(32), batch=8))
    # Steps done equal --steps: Skyhive resumes, trains nothing and evaluates.
    out = skyhive_cmd("train", "--model", "gpt-mini", *LM, "--steps", "28", "--resume", "--checkpoint", str(path), cwd=tmp_path)
    assert "resumed from" in out and "at step 28" in out, out
    ppl = printed(out)[0]
    print(f"twin: {want:.4f}; skyhive on the twin's checkpoint: {ppl}")
    assert abs(ppl / want - 1) < 0.005


def test_damaged_checkpoints_are_refused(trained, tmp_path):
    d, _ = trained
    raw = bytearray((d / "lm.safetensors").read_bytes())
    raw[-5] ^= 0xFF
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(bytes(raw))
    with pytest.raises(checkpoint.CheckpointError, match="checksum"):
        models.load(str(bad))
    bad.write_bytes(bytes(raw[: len(raw) // 2]))
    with pytest.raises(checkpoint.CheckpointError):
        models.load(str(bad))
    with pytest.raises(skyhive.ConfigError, match="no twin"):
        models.build("bert-tiny")


def fashion_test_set():
    with gzip.open(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return x, torch.from_numpy(y.astype(np.int64))


@pytest.mark.parametrize("spec", ["mlp-small", "mlp"])
def test_mlp_twin_classifies_as_skyhive_does(spec, tmp_path):
    if not os.path.exists(FASHION):
        pytest.skip(f"no Fashion-MNIST at {FASHION}: run scripts/setup.sh")
    out = skyhive_cmd("train", "--model", spec, "--epochs", "1", "--limit", "3000", "--checkpoint", "m.safetensors",
                      "--json", cwd=tmp_path)
    want = json.loads(out[out.index("{"):out.rindex("}") + 1])["test_accuracy"]
    ck = checkpoint.load(str(tmp_path / "m.safetensors"))
    model = models.load(str(tmp_path / "m.safetensors"))
    assert {n for n, _ in model.skyhive_parameters()} == {n[len("model/"):] for n in ck.tensors if n.startswith("model/")}
    inp = json.loads(ck.meta["skyhive.input"])
    x, y = fashion_test_set()
    x = (torch.from_numpy(x.astype(np.float32)) * inp["scale"] - inp["mean"]) / inp["std"]
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    print(f"{spec}: skyhive {want}, twin {acc}")
    assert abs(acc - want) <= 2e-4  # at most two of 10,000 images on a float tie
