"""skyhive.Optimizer: a torch.optim optimizer that averages with a swarm."""

import torch

from .daemon import Daemon
from .errors import ConfigError, DaemonError
from .protocol import VERSION, Connection

# Options given in seconds here and as durations to the daemon.
_DURATIONS = {"round_interval", "timeout", "wait_peers", "join_timeout", "status_every"}
# hivemind's names for the daemon's options.
_HIVEMIND = {"matchmaking_time": "round_interval", "averaging_timeout": "timeout"}


def _twin(params):
    """The twin description the daemon checks, if params is a twin of a
    registry model (skyhive.models) that can average with Go peers."""
    spec = getattr(params, "spec", None)
    if not isinstance(params, torch.nn.Module) or not hasattr(params, "skyhive_parameters") or spec is None:
        return None
    data = getattr(params, "data_signature", None)
    if ":" in spec and not data:
        return None  # a GPT without its data's signature averages with PyTorch peers only
    return {"model": spec, "data": data or ""}


def _named(params, optimizer):
    if params is None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
    if isinstance(params, torch.nn.Module):
        params = params.skyhive_parameters() if hasattr(params, "skyhive_parameters") else params.named_parameters()
    out = []
    for i, item in enumerate(params):
        name, p = item if isinstance(item, tuple) else (f"param.{i}", item)
        if not isinstance(p, torch.Tensor):
            raise ConfigError(f"parameter {name} is a {type(p).__name__}, not a tensor")
        if p.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ConfigError(f"parameter {name} is {p.dtype}: the daemon averages float32, float16 and bfloat16 parameters")
        out.append((name, p))
    if not out:
        raise ConfigError("no parameters: give the model's parameters (or an optimizer over them)")
    return out


def _state_buffers(opt, p):
    """The names of the optimizer's per-parameter state buffers of p (each
    of p's shape) that skyhive serves to late joiners: those it holds
    already, else those torch's SGD (momentum, no dampening), Adam and AdamW
    start from zero. Others start afresh on a joiner."""
    held = [k for k, v in opt.state.get(p, {}).items() if isinstance(v, torch.Tensor) and v.shape == p.shape]
    if held:
        return sorted(held)
    group = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
    if isinstance(opt, torch.optim.SGD) and group.get("momentum", 0) and not group.get("dampening", 0):
        return ["momentum_buffer"]
    if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
        return ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group.get("amsgrad") else [])
    return []


def _options(opts):
    out = {}
    for k, v in opts.items():
        if v is None:
            continue
        k = _HIVEMIND.get(k, k)
        if k in _DURATIONS and isinstance(v, (int, float)):
            v = f"{float(v)}s"
        if k == "dht" and isinstance(v, str):
            v = [v]
        out[k] = v
    return out


class Optimizer:
    """Wraps a torch.optim optimizer and averages the model with the other
    peers of a run, as the algorithm says (hivemind's Optimizer, over
    Skyhive's daemon).

    Call step() after backward(), as with the wrapped optimizer. The daemon
    (started for this process unless ``daemon`` names a socket) joins the
    swarm through ``dht``; parameters and gradients cross to it through
    shared memory. Options the Go peer has (``codec``, ``aggregation``,
    ``inner_steps``, ``outer_lr``, ``outer_momentum``, ``fragments``,
    ``overlap_steps``, ``tau``, ``group_size``, ``period``, ``swarm_secret``,
    ``listen``, ``relay``, ...) are keyword arguments with the names of
    `skyhive peer`'s flags, ``_`` for ``-``; durations are in seconds.

    Args:
        params: the model, its named_parameters(), or its parameters (None:
            those of ``optimizer``). Names make shape errors readable. A twin
            of a Skyhive model (skyhive.models) averages with Go peers of
            the same model and data.
        optimizer: the torch.optim optimizer over the same parameters, or a
            callable that makes it from the parameters.
        dht: multiaddrs of a `skyhive dht` node or of peers of the swarm.
        run_id: the run; peers of one run average together (default: the
            daemon's, as `skyhive peer`'s --run-id).
        algo: "wagma", "allreduce", "local", "diloco" or "wa-diloco".
        batch_size_per_step: samples per step, for the swarm's progress
            (step(batch_size=...) overrides it).
        target_batch_size: samples that make a swarm epoch.
        matchmaking_time: WAGMA's round interval, in seconds.
        averaging_timeout: bound on one all-reduce, in seconds.
        min_peers: peers of the run (this one included) to wait for before
            training; with fixed ranks (all but wagma), exactly this many.
        daemon: socket of a running `skyhive daemon` to attach to.
        binary: the skyhive binary (default $SKYHIVE_BIN or PATH).
        seed: with a twin of a Skyhive model (skyhive.models), start from
            the weights a Go peer of this --seed starts from, so that the
            model averages with Go peers of the run from the first round.
        share_memory: keep float32 CPU parameters and their gradients in the
            shared memory, so that a step copies nothing (False: copy them
            at each step, as parameters on a GPU or in fp16/bf16 are).
    """

    def __init__(self, params=None, optimizer=None, *, dht, run_id=None, algo="wagma",
                 batch_size_per_step=None, target_batch_size=None, matchmaking_time=None,
                 averaging_timeout=None, min_peers=2, daemon=None, binary=None, share_memory=True, seed=None,
                 **options):
        if optimizer is None:
            raise ConfigError("give the optimizer to wrap: optimizer=torch.optim.AdamW(model.parameters())")
        if isinstance(optimizer, torch.optim.Optimizer):
            named = _named(params, optimizer)
        elif callable(optimizer):
            if params is None:
                raise ConfigError("give params when optimizer is a factory of the optimizer")
            named = _named(params, None)
            optimizer = optimizer([p for _, p in named])
        else:
            raise ConfigError(f"optimizer is a {type(optimizer).__name__}: give a torch.optim.Optimizer or a factory of one")
        wrapped = {id(p) for g in optimizer.param_groups for p in g["params"]}
        missing = [n for n, p in named if id(p) not in wrapped]
        if missing:
            raise ConfigError(f"the optimizer does not update parameter {missing[0]} (and {len(missing) - 1} more): "
                              "make it over the same parameters")
        self._twin = _twin(params)
        if seed is not None:
            if self._twin is None:
                raise ConfigError("seed= starts a twin of a Skyhive model (skyhive.models; a GPT built with data=) "
                                  "from the weights Go peers of --seed start from; this model is not one")
            self._twin.update(init=True, seed=int(seed))
        self.opt = optimizer
        self.batch_size_per_step = batch_size_per_step
        self._params = [p for _, p in named]
        self._share = share_memory
        self._closed = False
        opts = _options(dict(options, dht=dht, run_id=run_id, algo=algo, target_batch_size=target_batch_size,
                             matchmaking_time=matchmaking_time, averaging_timeout=averaging_timeout,
                             min_peers=min_peers))
        self._conn = None
        self._daemon = Daemon(socket=daemon, binary=binary)
        try:
            self._conn = Connection(self._daemon.socket, describe=self._daemon.describe)
            self._open(named, opts)
        except BaseException:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
            self._daemon.stop(timeout=5)
            raise

    def _open(self, named, opts):
        specs = [{"name": n, "shape": list(p.shape)} for n, p in named]
        bufs = [(n, p, _state_buffers(self.opt, p)) for n, p in named]
        state = [{"name": f"{n}.{b}", "shape": list(p.shape)} for n, p, bs in bufs for b in bs]
        hello = {"op": "hello", "version": VERSION, "params": specs, "state": state, "options": opts}
        if self._twin is not None:
            hello["twin"] = self._twin
        self._conn.send(hello)
        msg, self._mem = self._conn.shared_memory()
        flat = torch.frombuffer(self._mem, dtype=torch.float32)
        total = sum(p.numel() for p in self._params)
        self._views, self._state_views = [], []
        off = 0
        for p in self._params:
            n = p.numel()
            pv = flat[off:off + n].view(p.shape)
            gv = flat[total + off:total + off + n].view(p.shape)
            off += n
            with torch.no_grad():
                if msg.get("init"):
                    p.copy_(pv)  # the Go model's initial weights
                else:
                    pv.copy_(p.detach())
            self._views.append((pv, gv))
            if self._share and p.device.type == "cpu" and p.dtype == torch.float32:
                # The parameter and its gradient live in the shared memory:
                # nothing is copied at a step.
                p.data = pv
                p.grad = gv
                gv.zero_()
        off = 2 * total
        for _, p, bs in bufs:
            for b in bs:
                v = flat[off:off + p.numel()].view(p.shape)
                off += p.numel()
                self._state_views.append((p, b, v))
                self._start_buffer(p, b, v)
        self._conn.send({"op": "join"})
        msg = self._conn.recv()
        self.peer_id, self.addrs, self.model_signature = msg.get("peer"), msg.get("addrs", []), msg.get("model")
        self.round, self.donors = msg.get("round", 0), msg.get("donors", 0)
        self.stats, self.progress = {}, {}
        self._pull(grads=False)
        if self.donors:
            self._load_buffers(msg.get("opt_step", 0))

    def _start_buffer(self, p, b, v):
        """Makes the optimizer's buffer b of p start from v (the shared
        memory when p is shared, else a copy on p's device)."""
        st = self.opt.state[p]
        with torch.no_grad():
            if b in st:
                v.copy_(st[b].detach())
            else:
                v.zero_()
            if self._aliased(p, self._views[self._index(p)][0]):
                st[b] = v
            elif b not in st:
                st[b] = torch.zeros_like(p)
        if isinstance(self.opt, (torch.optim.Adam, torch.optim.AdamW)) and "step" not in st:
            group = next(g for g in self.opt.param_groups if any(q is p for q in g["params"]))
            dev = p.device if group.get("capturable") or group.get("fused") else "cpu"
            st["step"] = torch.zeros((), dtype=torch.float32, device=dev)

    def _index(self, p):
        return next(i for i, q in enumerate(self._params) if q is p)

    def _load_buffers(self, opt_step):
        """Installs the optimizer state downloaded from the swarm."""
        with torch.no_grad():
            for p, b, v in self._state_views:
                st = self.opt.state[p]
                if st[b].data_ptr() != v.data_ptr():
                    st[b].copy_(v)
                if isinstance(st.get("step"), torch.Tensor):
                    st["step"].fill_(opt_step)
                elif "step" in st:
                    st["step"] = opt_step

    def _push_buffers(self):
        """Writes the optimizer's buffers kept outside the shared memory into it."""
        with torch.no_grad():
            for p, b, v in self._state_views:
                t = self.opt.state[p].get(b)
                if t is not None and t.data_ptr() != v.data_ptr():
                    v.copy_(t)

    def _aliased(self, p, v):
        return p.data.data_ptr() == v.data_ptr()

    def _push(self, grads=True):
        with torch.no_grad():
            for p, (pv, gv) in zip(self._params, self._views):
                if not self._aliased(p, pv):
                    pv.copy_(p.detach())
                if grads:
                    if p.grad is None:
                        gv.zero_()
                    elif p.grad.data_ptr() != gv.data_ptr():
                        gv.copy_(p.grad)

    def _pull(self, grads=True):
        with torch.no_grad():
            for p, (pv, gv) in zip(self._params, self._views):
                if not self._aliased(p, pv):
                    p.copy_(pv)
                if grads and (p.grad is None or p.grad.data_ptr() != gv.data_ptr()):
                    if p.grad is None:
                        p.grad = gv.to(device=p.device, dtype=p.dtype, copy=True)
                    else:
                        p.grad.copy_(gv)

    def step(self, closure=None, batch_size=None):
        """Takes the wrapped optimizer's step and averages as the algorithm says.

        Raises NonFiniteError (nothing changed) if a parameter or gradient
        holds NaN or infinity, StepError if this step's averaging failed
        (the local step was taken), DaemonError if the daemon is gone."""
        if self._closed:
            raise DaemonError("the optimizer was shut down; make a new one")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        samples = batch_size if batch_size is not None else (self.batch_size_per_step or 0)
        self._push()
        self._conn.send({"op": "step", "samples": int(samples)})
        try:
            while True:
                msg = self._conn.recv()
                if msg["op"] == "inner_step":
                    self._inner_step()
                elif msg["op"] == "stepped":
                    break
                else:
                    raise DaemonError(f"unexpected message {msg['op']!r} from the daemon")
        except DaemonError:
            raise  # the daemon is gone: keep the parameters as they are here
        except BaseException:
            self._pull(grads=False)  # what the daemon took of the step (StepError: the local step)
            raise
        self._pull(grads=False)
        self.round = msg.get("round", self.round)
        self.stats, self.progress = msg.get("stats") or {}, msg.get("progress") or {}
        return loss

    def _inner_step(self):
        self._pull()
        try:
            self.opt.step()
        except Exception as e:
            self._conn.send({"op": "error", "kind": "step", "error": f"{type(e).__name__}: {e}"})
            raise
        self._push(grads=False)
        self._push_buffers()
        self._conn.send({"op": "inner_done"})

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients in place, keeping them in shared memory
        (set_to_none is accepted for torch.optim's signature and ignored)."""
        for p in self._params:
            g = p.grad
            if g is not None:
                if g.grad_fn is not None:
                    g.detach_()
                else:
                    g.requires_grad_(False)
                g.zero_()

    @property
    def daemon_pid(self):
        """The PID of the daemon this optimizer started (None when attached to one)."""
        return self._daemon.proc.pid if self._daemon.proc else None

    @property
    def param_groups(self):
        return self.opt.param_groups

    @property
    def epoch(self):
        """The swarm's epoch (target_batch_size samples each)."""
        return self.progress.get("epoch", 0)

    def state_dict(self):
        """The wrapped optimizer's state and the averaging round."""
        return {"optimizer": self.opt.state_dict(), "round": self.round}

    def load_state_dict(self, state):
        self.opt.load_state_dict(state["optimizer"])

    def status(self):
        """Asks the daemon for the optimizer's statistics and the swarm's progress."""
        self._conn.send({"op": "status"})
        msg = self._conn.recv()
        self.round = msg.get("round", self.round)
        self.stats, self.progress = msg.get("stats") or {}, msg.get("progress") or {}
        return {"peer": self.peer_id, "round": self.round, "stats": self.stats, "progress": self.progress}

    def shutdown(self):
        """Leaves the swarm; the parameters keep their values."""
        if self._closed:
            return
        self._closed = True
        try:
            # Parameters in shared memory move to memory of their own.
            with torch.no_grad():
                for p, (pv, gv) in zip(self._params, self._views):
                    if self._aliased(p, pv):
                        p.data = pv.clone()
                    if p.grad is not None and p.grad.data_ptr() == gv.data_ptr():
                        p.grad = gv.clone()
                for p, b, v in self._state_views:
                    st = self.opt.state.get(p, {})
                    if isinstance(st.get(b), torch.Tensor) and st[b].data_ptr() == v.data_ptr():
                        st[b] = v.clone()
            try:
                self._conn.send({"op": "close"})
                self._conn.recv()
            except DaemonError:
                pass
        finally:
            self._conn.close()
            self._daemon.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def __del__(self):
        try:
            if not self._closed:
                self.shutdown()
        except Exception:
            pass
