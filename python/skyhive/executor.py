"""The executor: a PyTorch process that computes for a Skyhive role.

A role (`skyhive server --executor python --module pkg.mod:fn`) starts
`python3 -m skyhive.executor` itself and hands it two inherited file
descriptors: a Unix socket only the two processes hold, carrying the
framed JSON control messages of package bridge (4-byte big-endian length,
one JSON object), and a sealed shared-memory region of float32 elements
that holds the tensors of each call. The role sends requests, the executor
answers each in order:

    hello {version, module, device}     -> ready {device, torch}
    build {uid, hidden, seed}           -> built {params}
    forward {uid, shape, x, out}        -> done {shape, seconds, memory}
    backward {uid, shape, x, dy, out,
              zero, step, clip}         -> done {shape, norm, stepped, ...}
    state {uid}                         -> state {tensors, step}
    read {uid, name, at}                -> done {shape}
    write {uid, name, shape, at, step}  -> done
    close                               -> closed

x, dy, out and at are element offsets into the region. A failed request
is answered {op: "error", kind, error} and the executor goes on; it exits
when the socket closes, so it never outlives its role.

The module is the user's: `fn(hidden)` returns a torch.nn.Module mapping
inputs of shape [rows, ..., hidden] to outputs of the same shape. It is
called once per hosted expert with torch's generator seeded from the
server's seed and the expert's UID, so an expert's initial weights do not
depend on the server that hosts it. Each expert trains with its own
torch.optim.AdamW (biases and other 1-d parameters without weight decay,
as Skyhive's Go experts do)."""

import argparse
import hashlib
import importlib
import json
import mmap
import os
import resource
import socket
import struct
import sys
import time

VERSION = 1
MAX_MESSAGE_BYTES = 1 << 20


class Failure(Exception):
    """A request the executor refuses; kind says whose fault it is."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def load_factory(spec):
    """The function `pkg.mod:fn` names, or Failure saying what to fix."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise Failure("config", f"--module {spec!r}: want package.module:function, for example mypkg.experts:make_ffn")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # the user's import may raise anything
        raise Failure("config", f"--module {spec}: cannot import {mod_name}: {type(e).__name__}: {e} "
                      f"(is it on PYTHONPATH? the executor runs {sys.executable} in {os.getcwd()})") from e
    fn = mod
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise Failure("config", f"--module {spec}: {mod_name} has no {attr}")
    if not callable(fn):
        raise Failure("config", f"--module {spec}: {attr} is a {type(fn).__name__}, not a function")
    return fn


def expert_seed(seed, uid):
    """The seed of an expert's initial weights: the server's seed and the UID."""
    h = hashlib.sha256(f"{seed}/{uid}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


class Executor:
    def __init__(self, sock, region):
        self.sock = sock
        self.region = region
        self.torch = None
        self.buf = None
        self.device = None
        self.factory = None
        self.experts = {}
        self.lr = 1e-3
        self.weight_decay = 0.0

    # --- protocol ---------------------------------------------------------

    def read(self):
        hdr = self._read(4)
        if hdr is None:
            return None
        (n,) = struct.unpack(">I", hdr)
        if n == 0 or n > MAX_MESSAGE_BYTES:
            raise Failure("protocol", f"message of {n} bytes")
        body = self._read(n)
        if body is None:
            return None
        return json.loads(body)

    def _read(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def send(self, msg):
        body = json.dumps(msg, separators=(",", ":")).encode()
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def serve(self):
        while True:
            msg = self.read()
            if msg is None:
                return
            op = msg.get("op")
            if op == "close":
                self.send({"op": "closed"})
                return
            try:
                handler = getattr(self, "op_" + str(op), None)
                if handler is None:
                    raise Failure("protocol", f"unknown op {op!r}")
                self.send(handler(msg))
            except Failure as e:
                self.send({"op": "error", "kind": e.kind, "error": str(e)})
            except Exception as e:  # the user's module may raise anything
                self.send({"op": "error", "kind": "module", "error": f"{type(e).__name__}: {e}"})

    # --- helpers ----------------------------------------------------------

    def _expert(self, msg):
        uid = msg.get("uid")
        ex = self.experts.get(uid)
        if ex is None:
            raise Failure("protocol", f"expert {uid!r} was not built")
        return ex

    def _tensor(self, at, shape):
        n = 1
        for d in shape:
            n *= int(d)
        at = int(at)
        if at < 0 or n < 0 or at + n > self.buf.numel():
            raise Failure("protocol", f"tensor of shape {shape} at {at} does not fit the region of {self.buf.numel()} elements")
        return self.buf[at:at + n].view(*shape)

    def _put(self, at, t, limit=None):
        t = t.detach().reshape(-1)
        n = t.numel()
        end = self.buf.numel() if limit is None else limit
        if at + n > end:
            raise Failure("module", f"output of {n} elements does not fit the {end - at} left in the region: "
                          f"the module's output must have its input's shape")
        if t.dtype != self.torch.float32:
            t = t.float()
        self.buf[at:at + n].copy_(t)

    def _sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def _memory(self):
        if self.device.type == "cuda":
            return int(self.torch.cuda.max_memory_allocated(self.device))
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    # --- operations -------------------------------------------------------

    def op_hello(self, msg):
        if msg.get("version") != VERSION:
            raise Failure("config", f"the role speaks executor protocol {msg.get('version')}, this skyhive package "
                          f"{VERSION}: install the package of the same Skyhive version as the binary")
        import torch  # imported here, so that a missing torch is an answer, not a silent exit
        self.torch = torch
        self.buf = torch.frombuffer(self.region, dtype=torch.float32)
        dev = msg.get("device") or "auto"
        if dev == "auto":
            dev = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            self.device = torch.device(dev)
            torch.empty(1, device=self.device)
        except (RuntimeError, AssertionError) as e:
            raise Failure("config", f"--device {dev}: {e}") from e
        self.lr = float(msg.get("lr") or 1e-3)
        self.weight_decay = float(msg.get("weight_decay") or 0.0)
        self.factory = load_factory(str(msg.get("module", "")))
        return {"op": "ready", "device": str(self.device), "torch": torch.__version__}

    def op_build(self, msg):
        torch = self.torch
        uid, hidden = str(msg["uid"]), int(msg["hidden"])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(expert_seed(int(msg.get("seed", 0)), uid))
            module = self.factory(hidden)
        if not isinstance(module, torch.nn.Module):
            raise Failure("config", f"the module function returned a {type(module).__name__}, not a torch.nn.Module")
        module = module.to(self.device).float().train()
        params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        decay = [p for _, p in params if p.dim() > 1]
        no_decay = [p for _, p in params if p.dim() <= 1]
        groups = [g for g in ({"params": decay, "weight_decay": self.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
        # foreach: one kernel per step over all tensors, not one per tensor
        # (on the CPU of PyTorch 1.13 a third less time for an 8M-parameter FFN).
        opt = torch.optim.AdamW(groups, lr=self.lr, foreach=True) if groups else None
        self.experts[uid] = {"module": module, "opt": opt, "params": dict(params), "step": 0}
        return {"op": "built", "params": [{"name": n, "shape": list(p.shape)} for n, p in params]}

    def op_forward(self, msg):
        torch = self.torch
        ex = self._expert(msg)
        shape = [int(d) for d in msg["shape"]]
        x = self._tensor(msg["x"], shape).to(self.device, copy=True)
        start = time.perf_counter()
        with torch.no_grad():
            y = ex["module"](x)
        self._check_output(y, shape)
        self._put(int(msg["out"]), y)
        self._sync()
        return {"op": "done", "shape": list(y.shape), "seconds": time.perf_counter() - start, "memory": self._memory()}

    def op_backward(self, msg):
        torch = self.torch
        ex = self._expert(msg)
        module, opt = ex["module"], ex["opt"]
        shape = [int(d) for d in msg["shape"]]
        x = self._tensor(msg["x"], shape).to(self.device, copy=True)
        dy = self._tensor(msg["dy"], shape).to(self.device, copy=True)
        start = time.perf_counter()
        if msg.get("zero"):
            module.zero_grad(set_to_none=False)
        x.requires_grad_(True)
        with torch.enable_grad():
            y = module(x)
            self._check_output(y, shape)
            y.backward(dy)
        self._put(int(msg["out"]), x.grad)
        out = {"op": "done", "shape": list(x.grad.shape)}
        batches = int(msg.get("step") or 0)
        if batches > 0 and opt is not None:
            params = list(ex["params"].values())
            grads = [p.grad for p in params if p.grad is not None]
            if batches > 1:
                for g in grads:
                    g.div_(batches)
            # Each tensor's norm in float32 (a non-finite value stays non-finite), their sum in float64.
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]).double()).item() if grads else 0.0
            clip = float(msg.get("clip") or 0)
            finite = norm == norm and norm != float("inf")
            if finite:
                if clip > 0 and norm > clip:
                    for g in grads:
                        g.mul_(clip / (norm + 1e-12))
                opt.step()
                ex["step"] += 1
            module.zero_grad(set_to_none=False)
            out.update({"norm": norm if finite else None, "stepped": finite, "skipped": not finite})
        self._sync()
        out.update({"seconds": time.perf_counter() - start, "memory": self._memory()})
        return out

    def _check_output(self, y, shape):
        if not isinstance(y, self.torch.Tensor):
            raise Failure("module", f"the module returned a {type(y).__name__}, not a tensor")
        if list(y.shape) != shape:
            raise Failure("module", f"the module returned shape {list(y.shape)} for an input of shape {shape}: "
                          f"an expert's output must have its input's shape")

    def _state_tensors(self, ex, create=False):
        """The expert's parameters and AdamW moments by name; moments not
        made yet are zeros (created in the optimizer when create is set)."""
        torch = self.torch
        out = {}
        for name, p in ex["params"].items():
            out[name] = p
            st = ex["opt"].state.get(p) if ex["opt"] is not None else None
            if create and ex["opt"] is not None and not st:
                st = ex["opt"].state[p] = {"step": torch.tensor(float(ex["step"])),
                                          "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                          "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
            for key in ("exp_avg", "exp_avg_sq"):
                t = st.get(key) if st else None
                out[f"opt/{name}.{key}"] = t if t is not None else torch.zeros_like(p)
        return out

    def op_state(self, msg):
        ex = self._expert(msg)
        tensors = self._state_tensors(ex)
        return {"op": "state", "step": ex["step"],
                "tensors": [{"name": n, "shape": list(t.shape)} for n, t in tensors.items()]}

    def op_read(self, msg):
        ex = self._expert(msg)
        t = self._state_tensors(ex).get(msg.get("name"))
        if t is None:
            raise Failure("protocol", f"expert {msg.get('uid')} has no tensor {msg.get('name')!r}")
        self._put(int(msg["at"]), t)
        self._sync()
        return {"op": "done", "shape": list(t.shape)}

    def op_write(self, msg):
        torch = self.torch
        ex = self._expert(msg)
        t = self._state_tensors(ex, create=True).get(msg.get("name"))
        if t is None:
            raise Failure("protocol", f"expert {msg.get('uid')} has no tensor {msg.get('name')!r}")
        shape = [int(d) for d in msg["shape"]]
        if list(t.shape) != shape:
            raise Failure("config", f"tensor {msg.get('name')} of expert {msg.get('uid')}: shape {shape}, "
                          f"the module has {list(t.shape)}")
        with torch.no_grad():
            t.copy_(self._tensor(msg["at"], shape))
        step = int(msg.get("step") or 0)
        ex["step"] = step
        if ex["opt"] is not None:
            for p in ex["params"].values():
                st = ex["opt"].state.get(p)
                if st:
                    st["step"] = torch.tensor(float(step))
        return {"op": "done"}


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python3 -m skyhive.executor",
        description="Computes PyTorch modules for a Skyhive role. Started by the role "
                    "(skyhive server --executor python), not by hand.")
    ap.add_argument("--control-fd", type=int, required=True, help="the inherited control socket")
    ap.add_argument("--shm-fd", type=int, required=True, help="the inherited shared-memory region")
    ap.add_argument("--shm-bytes", type=int, required=True, help="the region's size")
    args = ap.parse_args(argv)
    sock = socket.socket(fileno=args.control_fd)
    region = mmap.mmap(args.shm_fd, args.shm_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(args.shm_fd)
    ex = Executor(sock, region)
    try:
        ex.serve()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sock.close()


if __name__ == "__main__":
    main()
