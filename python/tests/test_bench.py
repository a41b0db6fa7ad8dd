"""`skyhive bench pytorch --quick` runs the package's benchmark and the
PyTorch expert server's, and reports every comparison in the benchmark
protocol."""

import json
import os
import subprocess

from swarm import PYTHON_DIR, binary


def test_bench_pytorch_quick():
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, SKYHIVE_PYTHON="/usr/bin/python3")
    out = subprocess.run([binary(), "bench", "pytorch", "--quick", "--json"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(l) for l in out.stdout.splitlines() if l.strip()]
    cases = {l["case"]: l for l in lines}
    assert set(cases) == {"cnn-step", "crossing", "remote-expert/h1024/b64", "executor-ffn-fwd+bwd/h1024/b64",
                          "executor-bridge-share/h1024/b64"}, lines
    for l in lines:
        assert l["suite"] == "pytorch" and l["value"] > 0, l
        if l["metric"] == "share":  # the bridge's share of the executor's calls
            assert l["value"] < 1 and l["unit"] == "fraction", l
        else:
            assert l["baseline_value"] > 0 and l["ratio"] > 0, l
