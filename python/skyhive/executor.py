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

and for a pipeline stage (the module is skyhive.stages:layers):

    stage {spec, first, last, optim}    -> built {params}
    stage_forward {micro, shape, x,
                   out, room}           -> done {shape, seconds, cpu}
    stage_backward {micro, shape, dy,
                    out}                -> done {shape, seconds, cpu}
    stage_grads                         -> done {norm: sum of squares}
    stage_step {lr, scale}              -> done
    stage_discard                       -> done
    stage_free                          -> done
    stage_profile {shape, x, yshape, dy,
                   reps, optim}         -> profile {fwd, bwd, passes,
                                                    per_param, memory}

each taking the stage's uid ("stage" when absent; a worker profiles the
whole model as "profile"), with state, read and write under that uid.

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

    # --- pipeline stages ----------------------------------------------------

    def op_stage(self, msg):
        """Builds layers [first, last) of the registry model spec (the
        layers of skyhive.stages) with their optimizer; the weights come
        next, through write."""
        torch = self.torch
        spec, first, last = str(msg.get("spec", "")), int(msg.get("first") or 0), int(msg["last"])
        from .errors import ConfigError
        try:
            entries = self.factory(spec)
        except ConfigError as e:
            raise Failure("config", str(e)) from e
        if not 0 <= first < last <= len(entries):
            raise Failure("config", f"layers [{first},{last}) of a {len(entries)}-layer model {spec}")
        mods = [m for m, _ in entries[first:last]]
        names = [n for _, ns in entries[first:last] for n in ns]
        module = torch.nn.Sequential(*mods).to(self.device).float().train()
        params = list(zip(names, module.parameters()))
        o = msg.get("optim") or {}
        kind, lr, wd = o.get("kind") or "adamw", float(o.get("lr") or 1e-3), float(o.get("weight_decay") or 0)
        ps = [p for _, p in params]
        if not ps:
            opt = None
        elif kind == "sgd":
            opt = torch.optim.SGD(ps, lr=lr, momentum=float(o.get("momentum") or 0), weight_decay=wd, foreach=True)
        elif kind == "adamw":
            # As Skyhive's AdamW: biases and LayerNorm parameters without decay.
            groups = [g for g in ({"params": [p for p in ps if p.dim() > 1], "weight_decay": wd},
                                  {"params": [p for p in ps if p.dim() <= 1], "weight_decay": 0.0}) if g["params"]]
            opt = torch.optim.AdamW(groups, lr=lr, foreach=True)
        else:
            raise Failure("config", f"optimizer {kind!r}: want adamw or sgd")
        module.zero_grad(set_to_none=False)
        self.experts[str(msg.get("uid") or "stage")] = {"module": module, "opt": opt, "params": dict(params),
                                                        "step": 0, "kind": kind, "kept": {}, "first": first,
                                                        "layers": mods}
        return {"op": "built", "params": [{"name": n, "shape": list(p.shape)} for n, p in params]}

    def _stage(self, msg):
        st = self.experts.get(str(msg.get("uid") or "stage"))
        if st is None or "kept" not in st:
            raise Failure("protocol", "no stage was built")
        return st

    def _busy(self, wall0, cpu0):
        """Seconds the device was busy since (wall0, cpu0): the wall time on
        a GPU (synchronized); on the CPU the smaller of the wall time and
        the process's CPU time."""
        wall = time.perf_counter() - wall0
        if self.device.type == "cuda":
            return wall
        # The process's CPU time counts each of torch's threads; the wall
        # time, other processes' turns on the cores: the smaller is closer.
        return min(wall, time.process_time() - cpu0)

    def op_stage_forward(self, msg):
        """Runs the stage on micro-batch msg.micro, keeping what its
        backward needs; the output goes to out (at most msg.room elements)."""
        torch = self.torch
        st = self._stage(msg)
        shape = [int(d) for d in msg["shape"]]
        x = self._tensor(msg["x"], shape).to(self.device, copy=True)
        start, cpu = time.perf_counter(), time.process_time()
        if st["first"] > 0:
            x.requires_grad_(True)
        with torch.enable_grad():
            y = st["module"](x)
        if not isinstance(y, torch.Tensor):
            raise Failure("module", f"the stage returned a {type(y).__name__}, not a tensor")
        out = int(msg["out"])
        self._put(out, y, limit=out + int(msg["room"]))
        self._sync()
        st["kept"][int(msg.get("micro") or 0)] = (x, y)
        return {"op": "done", "shape": list(y.shape), "seconds": time.perf_counter() - start,
                "cpu": self._busy(start, cpu), "memory": self._memory()}

    def op_stage_backward(self, msg):
        """Backpropagates dy through micro-batch msg.micro's forward pass;
        gradients accumulate; dx goes to out unless the stage is the first."""
        st = self._stage(msg)
        micro = int(msg.get("micro") or 0)
        kept = st["kept"].pop(micro, None)
        if kept is None:
            raise Failure("protocol", f"no forward pass of micro-batch {micro} to backpropagate")
        x, y = kept
        shape = [int(d) for d in msg["shape"]]
        if list(y.shape) != shape:
            raise Failure("protocol", f"gradient of shape {shape} for an output of shape {list(y.shape)}")
        dy = self._tensor(msg["dy"], shape).to(self.device, copy=True)
        start, cpu = time.perf_counter(), time.process_time()
        y.backward(dy)
        out = {"op": "done", "shape": []}
        if x.grad is not None:
            self._put(int(msg["out"]), x.grad, limit=int(msg["out"]) + x.numel())
            out["shape"] = list(x.grad.shape)
        self._sync()
        out.update({"seconds": time.perf_counter() - start, "cpu": self._busy(start, cpu), "memory": self._memory()})
        return out

    def op_stage_grads(self, msg):
        """The sum of the squared gradients (float64)."""
        st = self._stage(msg)
        total = 0.0
        for p in st["params"].values():
            total += float(p.grad.double().pow(2).sum()) if p.grad is not None else 0.0
        return {"op": "done", "norm": total}

    def op_stage_step(self, msg):
        """Scales the accumulated gradients, steps the optimizer at lr and
        zeroes the gradients."""
        st = self._stage(msg)
        start, cpu = time.perf_counter(), time.process_time()
        scale, lr = float(msg.get("scale") or 1), float(msg["lr"])
        grads = [p.grad for p in st["params"].values() if p.grad is not None]
        if scale != 1 and grads:
            self.torch._foreach_mul_(grads, scale)
        if st["opt"] is not None:
            for g in st["opt"].param_groups:
                g["lr"] = lr
            st["opt"].step()
        st["step"] += 1
        st["module"].zero_grad(set_to_none=False)
        self._sync()
        return {"op": "done", "seconds": time.perf_counter() - start, "cpu": self._busy(start, cpu)}

    def op_stage_profile(self, msg):
        """Times each layer's forward and backward pass on x (labels y for
        the cross entropy of the output), reps + 1 times, the first a
        warm-up; then, with optim set, reps + 1 optimizer steps. Returns
        the medians of each layer's busy seconds (see _busy), each pass's
        wall and busy seconds, the optimizer's busy seconds per parameter,
        and the peak memory."""
        torch = self.torch
        F = torch.nn.functional
        st = self._stage(msg)
        shape, yshape = [int(d) for d in msg["shape"]], [int(d) for d in msg["yshape"]]
        x = self._tensor(msg["x"], shape).to(self.device, copy=True)
        y = self._tensor(msg["dy"], yshape).to(self.device, copy=True).long()
        reps = int(msg.get("reps") or 1)
        layers = st["layers"]
        fwd, bwd = [[] for _ in layers], [[] for _ in layers]
        passes = []
        for rep in range(reps + 1):
            wall0, cpu0 = time.perf_counter(), time.process_time()
            ins, outs, h = [], [], x
            for i, layer in enumerate(layers):
                h = h.detach()
                if h.is_floating_point() and i > 0:
                    h.requires_grad_(True)
                t0, c0 = time.perf_counter(), time.process_time()
                with torch.enable_grad():
                    out = layer(h)
                self._sync()
                if rep:
                    fwd[i].append(self._busy(t0, c0))
                ins.append(h)
                outs.append(out)
                h = out
            with torch.enable_grad():
                loss = F.cross_entropy(h.reshape(-1, h.shape[-1]), y.reshape(-1))
            g = torch.autograd.grad(loss, h)[0]
            for i in range(len(layers) - 1, -1, -1):
                t0, c0 = time.perf_counter(), time.process_time()
                if outs[i].requires_grad:
                    outs[i].backward(g)
                self._sync()
                if rep:
                    bwd[i].append(self._busy(t0, c0))
                g = ins[i].grad
                if g is None:
                    break
            if rep:
                passes.append([time.perf_counter() - wall0, self._busy(wall0, cpu0)])
        st["module"].zero_grad(set_to_none=False)
        per_param = 0.0
        if msg.get("optim_steps") and st["opt"] is not None:
            steps = []
            for rep in range(reps + 1):
                t0, c0 = time.perf_counter(), time.process_time()
                st["opt"].step()
                self._sync()
                if rep:
                    steps.append(self._busy(t0, c0))
            n = sum(p.numel() for p in st["params"].values())
            per_param = sorted(steps)[len(steps) // 2] / max(n, 1)

        def median(v):
            return sorted(v)[len(v) // 2] if v else 0.0

        return {"op": "profile", "fwd": [median(v) for v in fwd], "bwd": [median(v) for v in bwd],
                "passes": passes, "per_param": per_param, "memory": self._memory()}

    def op_stage_free(self, msg):
        """Forgets a stage: its layers, optimizer and kept passes."""
        st = self._stage(msg)
        st["kept"].clear()
        del self.experts[str(msg.get("uid") or "stage")]
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()
        return {"op": "done"}

    def op_stage_discard(self, msg):
        """Drops kept forward passes and zeroes the gradients."""
        st = self._stage(msg)
        st["kept"].clear()
        st["module"].zero_grad(set_to_none=False)
        return {"op": "done"}

    def _check_output(self, y, shape):
        if not isinstance(y, self.torch.Tensor):
            raise Failure("module", f"the module returned a {type(y).__name__}, not a tensor")
        if list(y.shape) != shape:
            raise Failure("module", f"the module returned shape {list(y.shape)} for an input of shape {shape}: "
                          f"an expert's output must have its input's shape")

    def _state_tensors(self, ex, create=False):
        """The expert's parameters and AdamW moments by name; moments not
        made yet are zeros (created in the optimizer when create is set).
        A pipeline stage's are named as Skyhive's optimizers name them."""
        if "kept" in ex:
            return self._stage_tensors(ex, create)
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

    def _stage_tensors(self, st, create):
        """A stage's parameters, then its optimizer's buffers under
        Skyhive's names: "<name>.m" and "<name>.v" (AdamW), "<name>.momentum"
        (SGD with momentum)."""
        torch = self.torch
        opt, kind = st["opt"], st["kind"]
        keys = {"adamw": (("exp_avg", "m"), ("exp_avg_sq", "v")), "sgd": (("momentum_buffer", "momentum"),)}[kind]
        if kind == "sgd" and not (opt is not None and opt.defaults.get("momentum")):
            keys = ()
        out = dict(st["params"])
        for name, p in st["params"].items():
            state = opt.state.get(p) if opt is not None else None
            if create and opt is not None and not state:
                state = opt.state[p] = {k: torch.zeros_like(p, memory_format=torch.preserve_format) for k, _ in keys}
                if kind == "adamw":
                    state["step"] = torch.tensor(float(st["step"]))
            for key, suffix in keys:
                t = state.get(key) if state else None
                out[f"{name}.{suffix}"] = t if t is not None else torch.zeros_like(p)
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
                if st and "exp_avg" in st:
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
