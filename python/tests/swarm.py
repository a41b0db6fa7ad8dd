"""Helpers of the tests: a `skyhive dht` process and PyTorch peer processes on loopback."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)


def binary():
    path = os.environ.get("SKYHIVE_BIN") or os.path.join(os.path.dirname(PYTHON_DIR), "bin", "skyhive")
    if not os.access(path, os.X_OK):
        pytest.skip(f"no skyhive binary at {path}: run make build (or set SKYHIVE_BIN)")
    return path


class _Role:
    """A skyhive command on loopback, ready once it printed its address
    (and the line ready says, if any); addr is its multiaddr."""

    def __init__(self, args, what, env=None, ready=None, timeout=30):
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.addr, self.lines = None, []
        found = threading.Event()

        def read():
            for line in self.proc.stdout:
                self.lines.append(line)
                if self.addr is None and "/p2p/" in line and "127.0.0.1" in line:
                    self.addr = line.strip().split()[-1]
                if self.addr and (ready is None or ready in line):
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(timeout):
            self.stop()
            raise RuntimeError(f"{what} did not start:\n" + "".join(self.lines))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self):
        self.proc.kill()
        self.proc.wait()


class DHT(_Role):
    """A `skyhive dht` on loopback; addr is its multiaddr."""

    def __init__(self):
        super().__init__([binary(), "dht", "--listen", "/ip4/127.0.0.1/tcp/0"], "skyhive dht")


def run_peers(configs, timeout=300):
    """Runs worker.py once per config (a dict), in parallel processes, and
    returns their JSON results; a failed peer fails the test with its output."""
    procs = []
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
               SKYHIVE_BIN=binary(), OMP_NUM_THREADS="1")
    for c in configs:
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "worker.py"), json.dumps(c)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    deadline = time.monotonic() + timeout
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise AssertionError(f"peer exited with {p.returncode}:\n{stderr[-4000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


class Server(_Role):
    """A `skyhive server` on loopback hosting PyTorch experts
    (skyhive.experts:ffn in an executor on the CPU); addr is its multiaddr."""

    def __init__(self, experts, hidden, dht=None, seed=1, extra=()):
        args = [binary(), "server", "--listen", "/ip4/127.0.0.1/tcp/0", "--experts", experts, "--hidden", str(hidden),
                "--executor", "python", "--python", sys.executable, "--device", "cpu", "--module", "skyhive.experts:ffn",
                "--seed", str(seed), "--stats-every", "0", "--declare-every", "2s", *extra]
        if dht:
            args += ["--dht", dht]
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
        super().__init__(args, "skyhive server", env=env, ready="serving ", timeout=60)
