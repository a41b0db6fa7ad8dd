package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/swarm"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// WorkerConfig configures a stage worker.
type WorkerConfig struct {
	// Name labels the worker in the coordinator's tables (default: its
	// peer ID).
	Name string
	// Join is the coordinator's multiaddr including /p2p/<peer ID>.
	Join string
	// ListenAddrs are the worker's libp2p listen addresses (default
	// /ip4/127.0.0.1/tcp/0).
	ListenAddrs []string
	// IdentityFile keeps the worker's key across restarts (default
	// ephemeral).
	IdentityFile string
	// Slowdown ≥ 1 emulates a slower device: after each piece of compute
	// that used c of CPU time, the worker sleeps (Slowdown−1)·c
	// (swarm.Device.Throttle). 0 means 1. Ignored when Device is set.
	Slowdown float64
	// Device, if set, is the emulated device (slowdown, pause gate); e.g.
	// swarm.ChildFromEnv's in a swarm-launched process. Otherwise one is
	// made from Slowdown and MemCap.
	Device *swarm.Device
	// Region names the worker's network region (optional; required by a
	// coordinator with emulated links).
	Region string
	// MemCap, if positive, is the memory in bytes the worker offers for its
	// layers; a stage that needs more is refused.
	MemCap int64
	// Heartbeat is the interval of liveness pings to the coordinator
	// (default 1 s); after HeartbeatMisses failures in a row (default 5)
	// Run returns.
	Heartbeat       time.Duration
	HeartbeatMisses int
	// MaxMessageBytes bounds one RPC message (default
	// DefaultMaxMessageBytes).
	MaxMessageBytes int
	// Logger receives events; nil discards them.
	Logger *slog.Logger
}

// Worker serves one pipeline stage: it holds a contiguous block of a
// model's layers with their optimizer, runs forward and backward passes of
// micro-batches as the coordinator's schedule says, and exchanges
// activations and gradients directly with its neighbour stages.
type Worker struct {
	cfg   WorkerConfig
	host  *p2p.Host
	log   *slog.Logger
	coord peer.AddrInfo

	dev *swarm.Device // emulated device: slowdown and pause gate

	// runMu serialises everything that touches the stage's layers:
	// setup, iterations, commits, fetches and profiling.
	runMu sync.Mutex
	st    *stage // guarded by runMu

	mu         sync.Mutex // guards the fields below
	gen        uint64
	box        *inbox
	prev, next peer.ID
	cancelIter context.CancelCauseFunc
	aborted    abortReq // the last abort, which may arrive before its iteration

	stop     chan struct{} // closed by shutdown or Close
	stopOnce sync.Once
}

// stage is the worker's current assignment.
type stage struct {
	req     setupReq
	model   *nn.Sequential
	params  []*nn.Param
	opt     optim.Optimizer
	prev    peer.AddrInfo
	next    peer.AddrInfo
	in, out []int // per-example input and output shapes
	ready   int   // iteration whose gradients await a commit, or −1
	iter    int   // iterations committed
}

func (s *stage) first() bool { return s.req.Stage == 0 }
func (s *stage) last() bool  { return s.req.Stage == s.req.Stages-1 }

var errStopped = errors.New("pipeline: worker stopped")

// NewWorker starts a worker's host and handlers. Call Run to join the
// coordinator and serve, and Close to stop.
func NewWorker(ctx context.Context, cfg WorkerConfig) (*Worker, error) {
	if cfg.Slowdown == 0 {
		cfg.Slowdown = 1
	}
	dev := cfg.Device
	if dev == nil {
		var err error
		if dev, err = swarm.NewDevice("pipeline", cfg.Slowdown, max(cfg.MemCap, 0)); err != nil {
			return nil, fmt.Errorf("pipeline: %w", err)
		}
	}
	if cfg.MemCap < 0 {
		return nil, fmt.Errorf("pipeline: negative memory cap %d", cfg.MemCap)
	}
	coord, err := peer.AddrInfoFromString(cfg.Join)
	if err != nil {
		return nil, fmt.Errorf("pipeline: --join %q: want a multiaddr ending in /p2p/<peer id>: %w", cfg.Join, err)
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = time.Second
	}
	if cfg.HeartbeatMisses <= 0 {
		cfg.HeartbeatMisses = 5
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if len(cfg.ListenAddrs) == 0 {
		cfg.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	h, err := p2p.New(ctx, p2p.Config{
		IdentityFile:    cfg.IdentityFile,
		ListenAddrs:     cfg.ListenAddrs,
		MaxMessageBytes: cfg.MaxMessageBytes,
		MaxStreamBytes:  int64(cfg.MaxMessageBytes) * maxMicro,
		// An activation stream stays open for a whole iteration and may
		// wait for a slow neighbour's compute between messages.
		IdleTimeout: streamIdleTimeout,
		Logger:      cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("pipeline: worker host: %w", err)
	}
	w := &Worker{cfg: cfg, host: h, log: cfg.Logger, coord: *coord, dev: dev, box: newInbox(0, nil, nil), stop: make(chan struct{})}
	if w.cfg.Name == "" {
		w.cfg.Name = h.ID().ShortString()
	}
	w.handle(ProtoPing, func(context.Context, peer.ID, []byte) ([]byte, error) { return nil, nil })
	w.control(ProtoProfile, w.onProfile)
	w.control(ProtoSetup, w.onSetup)
	w.control(ProtoIter, w.onIter)
	w.control(ProtoCommit, w.onCommit)
	w.control(ProtoAbort, w.onAbort)
	w.control(ProtoFetch, w.onFetch)
	w.control(ProtoProbe, w.onProbe)
	w.control(ProtoShutdown, func(context.Context, []byte) ([]byte, error) {
		w.stopOnce.Do(func() { close(w.stop) })
		return nil, nil
	})
	w.host.SetStreamHandler(ProtoActs, w.onActs)
	return w, nil
}

func (w *Worker) handle(p protocol.ID, h p2p.Handler) { w.host.SetHandler(p, h) }

// control registers a handler that only the coordinator may call.
func (w *Worker) control(p protocol.ID, h func(ctx context.Context, req []byte) ([]byte, error)) {
	w.host.SetHandler(p, func(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
		if from != w.coord.ID {
			return nil, fmt.Errorf("pipeline: %s accepts calls from the coordinator only", p)
		}
		return h(ctx, req)
	})
}

// ID is the worker's peer ID.
func (w *Worker) ID() peer.ID { return w.host.ID() }

// SetSlowdown changes the emulated slowdown factor (≥ 1) while running,
// e.g. to emulate a device that becomes loaded.
func (w *Worker) SetSlowdown(f float64) { w.dev.SetSlowdown(f) }

// throttle emulates the device after an op that took wall time and used
// cpu of CPU time on this machine: the emulated device runs the op in
// slowdown·cpu, so the worker sleeps until that much time has passed since
// the op started. The sleep goes through swarm.Device.Throttle, which
// sleeps (slowdown−1)·d, with d = (slowdown·cpu − wall)/(slowdown−1); it
// also waits while the device is paused. Aiming at slowdown·cpu rather
// than slowdown·wall keeps time lost waiting for a core (other processes
// on the same machine, including co-located workers) out of the emulated
// speed, as long as the worker gets at least 1/slowdown of a core.
func (w *Worker) throttle(ctx context.Context, wall, cpu time.Duration) {
	f := w.dev.Slowdown()
	if f <= 1 {
		w.dev.Checkpoint(ctx)
		return
	}
	d := time.Duration((f*float64(cpu) - float64(wall)) / (f - 1))
	if d <= 0 {
		w.dev.Checkpoint(ctx) // the op already took its emulated time
		return
	}
	w.dev.Throttle(ctx, d) // returns early only when ctx ends, which callers check
}

// Close stops the worker: its host, connections and handlers.
func (w *Worker) Close() error {
	w.stopOnce.Do(func() { close(w.stop) })
	w.mu.Lock()
	if w.cancelIter != nil {
		w.cancelIter(errStopped)
	}
	w.mu.Unlock()
	return w.host.Close()
}

// Run registers with the coordinator and serves until ctx ends, the
// coordinator sends shutdown, Close is called, or the coordinator stops
// answering heartbeats. It returns nil on shutdown.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.register(ctx); err != nil {
		return err
	}
	misses := 0
	tick := time.NewTicker(w.cfg.Heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.stop:
			return nil
		case <-tick.C:
		}
		cctx, cancel := context.WithTimeout(ctx, w.cfg.Heartbeat*2)
		_, err := w.host.Call(cctx, w.coord, ProtoPing, nil)
		cancel()
		if err == nil {
			misses = 0
			continue
		}
		misses++
		w.log.Warn("pipeline: coordinator heartbeat failed", "misses", misses, "err", err)
		if misses >= w.cfg.HeartbeatMisses {
			return fmt.Errorf("pipeline: coordinator lost after %d missed heartbeats: %w", misses, err)
		}
	}
}

func (w *Worker) register(ctx context.Context) error {
	req := registerReq{Name: w.cfg.Name, Slowdown: w.dev.Slowdown(), MemCap: w.cfg.MemCap, Region: w.cfg.Region}
	for _, a := range w.host.AddrInfo().Addrs {
		req.Addrs = append(req.Addrs, a.String())
	}
	b, err := encodeMsg(req, nil)
	if err != nil {
		return err
	}
	var lastErr error
	for attempt := range 20 {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := w.host.Call(cctx, w.coord, ProtoRegister, b)
		cancel()
		if err == nil {
			var r registerResp
			if _, err := decodeMsg(resp, &r, wire.Limits{}); err != nil {
				return err
			}
			w.log.Info("pipeline: joined coordinator", "index", r.Index)
			return nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(min(attempt+1, 5)) * 200 * time.Millisecond):
		}
	}
	return fmt.Errorf("pipeline: join %s: %w", w.cfg.Join, lastErr)
}

// RunWorker starts a worker, serves until it stops, and closes it.
func RunWorker(ctx context.Context, cfg WorkerConfig) error {
	w, err := NewWorker(ctx, cfg)
	if err != nil {
		return err
	}
	runErr := w.Run(ctx)
	if err := w.Close(); err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}

// onProfile times forward and backward of every layer of the whole model:
// at req.Batch with the emulated slowdown (the device's speed), and
// without it at each req.Calibrate size (the layers' relative costs), and
// one optimizer step. Layer times are CPU times of the worker's thread
// (medians over the repetitions), so other processes' use of the cores
// does not leak into them.
func (w *Worker) onProfile(ctx context.Context, b []byte) ([]byte, error) {
	var req profileReq
	if _, err := decodeMsg(b, &req, wire.Limits{}); err != nil {
		return nil, err
	}
	if req.Batch < 1 || req.Batch > maxBatch || req.Reps < 1 || req.Reps > 50 || len(req.Calibrate) > 4 {
		return nil, fmt.Errorf("pipeline: bad profile request %+v", req)
	}
	for _, n := range req.Calibrate {
		if n < 1 || n > maxBatch {
			return nil, fmt.Errorf("pipeline: bad profile batch %d", n)
		}
	}
	if req.Optim.Kind != "" || req.Optim.LR != 0 {
		if err := req.Optim.Validate(); err != nil {
			return nil, err
		}
	}
	model, err := BuildModel(req.Model, req.Seed)
	if err != nil {
		return nil, err
	}
	if model.Len() > maxLayers {
		return nil, fmt.Errorf("pipeline: model of %d layers, at most %d", model.Len(), maxLayers)
	}
	w.runMu.Lock()
	defer w.runMu.Unlock()
	resp := profileResp{}
	// The device: whole-model passes at req.Batch, each followed by the
	// emulated slowdown.
	var times, cpus, overs []float64
	_, _, err = w.timeLayers(ctx, model, req.Seed, req.Batch, req.Reps, func(wall, cpu time.Duration) {
		t0 := time.Now()
		w.throttle(ctx, wall, cpu)
		slept := time.Since(t0)
		times = append(times, (wall + slept).Seconds())
		cpus = append(cpus, cpu.Seconds())
		// How late the emulated op ended: timer and scheduling delays.
		target := max(time.Duration(w.dev.Slowdown()*float64(cpu)), wall)
		overs = append(overs, max(wall+slept-target, 0).Seconds())
	})
	if err != nil {
		return nil, err
	}
	resp.Seconds, resp.CPU, resp.Overshoot = median(times), median(cpus), median(overs)
	resp.FLOPS = model.Cost([]int{req.Batch, InputFeatures}).TotalFLOPs() / resp.Seconds
	for _, n := range req.Calibrate {
		fwd, bwd, err := w.timeLayers(ctx, model, req.Seed, n, req.Reps, nil)
		if err != nil {
			return nil, err
		}
		resp.Fwd, resp.Bwd = append(resp.Fwd, fwd), append(resp.Bwd, bwd)
	}
	if req.Optim.LR > 0 {
		params := model.Params()
		opt := req.Optim.NewOptimizer(params)
		var steps []float64
		for i := range req.Reps + 1 {
			c := startOp()
			opt.Step()
			_, cpu := c.stop()
			if i > 0 {
				steps = append(steps, cpu.Seconds())
			}
		}
		n := 0
		for _, p := range params {
			n += p.Value.Len()
		}
		resp.OptimPerParam = median(steps) / float64(max(n, 1))
	}
	return encodeMsg(resp, nil)
}

// timeLayers runs forward and backward of model on a batch of n random
// examples reps+1 times (the first warms up) and returns each layer's
// median forward and backward CPU seconds. after, if set, is called after
// every pass with its wall and CPU time.
func (w *Worker) timeLayers(ctx context.Context, model *nn.Sequential, seed uint64, n, reps int, after func(wall, cpu time.Duration)) (fwd, bwd []float64, err error) {
	rng := rand.New(rand.NewPCG(seed, 7))
	x := tensor.New(n, InputFeatures)
	tensor.FillNormal(x.Data, rng, 0, 1)
	y := make([]int, n)
	for i := range y {
		y[i] = i % 10
	}
	layers := model.Layers()
	fs := make([][]float64, len(layers))
	bs := make([][]float64, len(layers))
	states := make([]nn.State, len(layers))
	for rep := range reps + 1 {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		var wall, cpu time.Duration
		h := x
		for i, l := range layers {
			c := startOp()
			h, states[i] = l.Module.Forward(nn.Ctx{Train: true}, h)
			dw, dc := c.stop()
			wall, cpu = wall+dw, cpu+dc
			if rep > 0 {
				fs[i] = append(fs[i], dc.Seconds())
			}
		}
		c := startOp()
		_, dy := nn.SoftmaxCrossEntropy(h, y)
		dw, dc := c.stop()
		wall, cpu = wall+dw, cpu+dc
		for i := len(layers) - 1; i >= 0 && dy != nil; i-- {
			c := startOp()
			dy = layers[i].Module.Backward(states[i], dy)
			dw, dc := c.stop()
			wall, cpu = wall+dw, cpu+dc
			if rep > 0 {
				bs[i] = append(bs[i], dc.Seconds())
			}
		}
		if rep > 0 && after != nil {
			after(wall, cpu)
		}
	}
	fwd, bwd = make([]float64, len(layers)), make([]float64, len(layers))
	for i := range layers {
		fwd[i], bwd[i] = median(fs[i]), median(bs[i])
	}
	return fwd, bwd, nil
}

// median returns the median of xs (0 if empty); it sorts xs.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	m := xs[len(xs)/2]
	if len(xs)%2 == 0 {
		m = (xs[len(xs)/2-1] + m) / 2
	}
	return m
}

// onSetup installs a stage (or releases the worker when Stage < 0).
func (w *Worker) onSetup(_ context.Context, b []byte) ([]byte, error) {
	var req setupReq
	ts, err := decodeMsg(b, &req, bulkLimits)
	if err != nil {
		return nil, err
	}
	// Switch generations first: activations of the old plan are refused
	// from now on, and a running iteration is stopped.
	w.mu.Lock()
	if req.Gen <= w.gen {
		w.mu.Unlock()
		return nil, fmt.Errorf("pipeline: stale setup generation %d (have %d)", req.Gen, w.gen)
	}
	w.gen = req.Gen
	if w.cancelIter != nil {
		w.cancelIter(errors.New("pipeline: re-planned"))
	}
	w.box = newInbox(req.Iter, nil, nil)
	w.prev, w.next = "", ""
	w.mu.Unlock()

	w.runMu.Lock()
	defer w.runMu.Unlock()
	w.st = nil
	if req.Stage < 0 {
		w.log.Info("pipeline: released", "gen", req.Gen)
		return nil, nil
	}
	st, err := w.buildStage(req, ts)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	if w.gen == req.Gen {
		w.box = newInbox(req.Iter, st.in, st.out)
		w.prev, w.next = st.prev.ID, st.next.ID
	}
	w.mu.Unlock()
	w.st = st
	w.log.Info("pipeline: stage installed", "gen", req.Gen, "stage", req.Stage, "layers", fmt.Sprintf("[%d,%d)", req.First, req.Last))
	return nil, nil
}

func (w *Worker) buildStage(req setupReq, ts []wire.Named) (*stage, error) {
	if req.Stages < 1 || req.Stages > maxStages || req.Stage >= req.Stages || req.Batch < 1 || req.Batch > maxBatch || req.Iter < 0 || req.Step < 0 {
		return nil, fmt.Errorf("pipeline: bad setup %d/%d batch %d", req.Stage, req.Stages, req.Batch)
	}
	if err := req.Optim.Validate(); err != nil {
		return nil, err
	}
	full, err := BuildModel(req.Model, req.Seed)
	if err != nil {
		return nil, err
	}
	if req.First < 0 || req.First >= req.Last || req.Last > full.Len() {
		return nil, fmt.Errorf("pipeline: layers [%d,%d) of a %d-layer model", req.First, req.Last, full.Len())
	}
	if (req.Stage == 0) != (req.First == 0) || (req.Stage == req.Stages-1) != (req.Last == full.Len()) {
		return nil, fmt.Errorf("pipeline: stage %d of %d cannot hold layers [%d,%d) of %d", req.Stage, req.Stages, req.First, req.Last, full.Len())
	}
	st := &stage{req: req, model: full.Slice(req.First, req.Last), ready: -1, iter: req.Iter}
	st.params = st.model.Params()
	snap, err := snapshotFrom(namedMap(ts), req.Step)
	if err != nil {
		return nil, err
	}
	if err := nn.ImportParams(st.params, snap.Params); err != nil {
		return nil, fmt.Errorf("pipeline: stage weights: %w", err)
	}
	st.opt = req.Optim.NewOptimizer(st.params)
	if err := st.opt.LoadState(optim.State{Step: req.Step, Tensors: snap.Optim}); err != nil {
		return nil, fmt.Errorf("pipeline: stage optimizer state: %w", err)
	}
	st.in = full.Slice(0, req.First).Cost([]int{1, InputFeatures}).OutShape[1:]
	cost := st.model.Cost(append([]int{req.Batch}, st.in...))
	st.out = cost.OutShape[1:]
	if need := alloc.StateCopies*4*cost.Params + cost.ActivationBytes; w.cfg.MemCap > 0 && need > w.cfg.MemCap {
		return nil, fmt.Errorf("pipeline: stage needs %d bytes, over the worker's memory cap of %d", need, w.cfg.MemCap)
	}
	if st.prev, err = req.Prev.addrInfo(); err != nil {
		return nil, err
	}
	if st.next, err = req.Next.addrInfo(); err != nil {
		return nil, err
	}
	if (st.prev.ID == "") != st.first() || (st.next.ID == "") != st.last() {
		return nil, errors.New("pipeline: setup neighbours do not match the stage position")
	}
	if req.Pin {
		for _, ai := range []peer.AddrInfo{st.prev, st.next} {
			if ai.ID != "" && len(ai.Addrs) > 0 {
				pinAddrs(w.host, ai.ID, ai.Addrs)
			}
		}
	}
	return st, nil
}

// onActs receives a neighbour's stream of activations or gradients (a
// sequence of length-prefixed act messages) and queues each in the inbox.
func (w *Worker) onActs(ctx context.Context, from peer.ID, r io.Reader, _ io.Writer) error {
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if uint64(n) > uint64(w.cfg.MaxMessageBytes) {
			return fmt.Errorf("%w: activation of %d bytes", errMsg, n)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return err
		}
		if err := w.onAct(from, b); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// onAct queues one activation or gradient from a neighbour.
func (w *Worker) onAct(from peer.ID, b []byte) error {
	var m actMsg
	ts, err := decodeMsg(b, &m, actLimits)
	if err != nil {
		return err
	}
	if len(ts) != 1 || ts[0].Name != "t" {
		return fmt.Errorf("%w: want one tensor \"t\"", errMsg)
	}
	w.mu.Lock()
	gen, box, prev, next := w.gen, w.box, w.prev, w.next
	w.mu.Unlock()
	switch {
	case m.Gen != gen:
		return fmt.Errorf("pipeline: activation of generation %d, current %d", m.Gen, gen)
	case !m.Backward && from != prev, m.Backward && from != next:
		return fmt.Errorf("pipeline: unexpected %v activation from %s", map[bool]string{false: "forward", true: "backward"}[m.Backward], from.ShortString())
	}
	return box.put(actKey{iter: m.Iter, micro: m.Micro, backward: m.Backward}, ts[0].Tensor)
}

// onIter runs one iteration of the current stage.
func (w *Worker) onIter(ctx context.Context, b []byte) ([]byte, error) {
	var req iterReq
	ts, err := decodeMsg(b, &req, bulkLimits)
	if err != nil {
		return nil, err
	}
	w.runMu.Lock()
	defer w.runMu.Unlock()
	st := w.st
	if st == nil || st.req.Gen != req.Gen {
		return nil, fmt.Errorf("pipeline: iteration of generation %d, worker has no stage of it", req.Gen)
	}
	if req.Iter != st.iter {
		return nil, fmt.Errorf("pipeline: iteration %d, worker expects %d", req.Iter, st.iter)
	}
	total := 0
	for _, n := range req.Sizes {
		if n < 1 || n > maxBatch {
			return nil, fmt.Errorf("pipeline: micro-batch of %d examples", n)
		}
		total += n
	}
	if len(req.Sizes) < 1 || len(req.Sizes) > maxMicro || total > maxBatch || req.Schedule.Micro(len(req.Sizes)) != len(req.Sizes) {
		return nil, fmt.Errorf("pipeline: bad micro-batch sizes (%d of them, %d examples, %s)", len(req.Sizes), total, req.Schedule)
	}
	in := namedMap(ts)
	var x *tensor.Tensor
	var y []int
	if st.first() {
		x = in["x"]
		if x == nil || !slices.Equal(x.Shape, append([]int{total}, st.in...)) {
			return nil, fmt.Errorf("pipeline: stage 0 needs inputs \"x\" of shape %v", append([]int{total}, st.in...))
		}
	}
	if st.last() {
		if y, err = labels(in["y"], total, st.out[len(st.out)-1]); err != nil {
			return nil, err
		}
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout <= 0 || timeout > time.Hour {
		timeout = time.Hour
	}
	ictx, cancel := context.WithCancelCause(ctx)
	ictx, cancelT := context.WithTimeout(ictx, timeout)
	defer cancelT()
	w.mu.Lock()
	if w.gen != req.Gen || w.aborted == (abortReq{Gen: req.Gen, Iter: req.Iter}) {
		w.mu.Unlock()
		cancel(nil)
		return nil, errors.New("pipeline: iteration aborted or re-planned before it started")
	}
	w.cancelIter = cancel
	box := w.box
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.cancelIter = nil
		w.mu.Unlock()
		cancel(nil)
	}()
	resp, err := w.runIter(ictx, st, box, req, x, y)
	box.done(req.Iter)
	if err != nil {
		nn.ZeroGrad(st.params)
		if cause := context.Cause(ictx); cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%w)", err, cause)
		}
		return nil, fmt.Errorf("pipeline: stage %d iteration %d: %w", st.req.Stage, req.Iter, err)
	}
	st.ready = req.Iter
	return encodeMsg(resp, nil)
}

// labels checks a float32 label tensor and converts it.
func labels(t *tensor.Tensor, n, classes int) ([]int, error) {
	if t == nil || !slices.Equal(t.Shape, []int{n}) {
		return nil, fmt.Errorf("pipeline: last stage needs labels \"y\" of shape [%d]", n)
	}
	y := make([]int, n)
	for i, v := range t.Data {
		if v != float32(int(v)) || v < 0 || int(v) >= classes {
			return nil, fmt.Errorf("pipeline: label %v not an integer in [0,%d)", v, classes)
		}
		y[i] = int(v)
	}
	return y, nil
}

// runIter executes the schedule's ops for one iteration.
func (w *Worker) runIter(ctx context.Context, st *stage, box *inbox, req iterReq, x *tensor.Tensor, y []int) (iterResp, error) {
	start := time.Now()
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	nn.ZeroGrad(st.params) // an uncommitted earlier iteration is discarded
	m := len(req.Sizes)
	total := 0
	offs := make([]int, m+1)
	for i, n := range req.Sizes {
		offs[i+1] = offs[i] + n
		total += n
	}
	var fwd, bwd *sender
	if !st.last() {
		fwd = w.startSender(ctx, st.next, req, false, m, fail)
	}
	if !st.first() {
		bwd = w.startSender(ctx, st.prev, req, true, m, fail)
	}
	var resp iterResp
	states := make([]nn.State, m)
	dlogits := make([]*tensor.Tensor, m)
	var compute, idle, cpu time.Duration
	var opErr error
	for _, op := range Ops(req.Schedule, st.req.Stage, st.req.Stages, m) {
		n := req.Sizes[op.Micro]
		var in *tensor.Tensor
		switch {
		case !op.Backward && st.first():
			in = rows(x, offs[op.Micro], offs[op.Micro+1])
		case op.Backward && st.last():
			in = dlogits[op.Micro]
		default:
			t0 := time.Now()
			t, err := box.get(ctx, actKey{iter: req.Iter, micro: op.Micro, backward: op.Backward})
			idle += time.Since(t0)
			if err != nil {
				opErr = fmt.Errorf("waiting for %v: %w", op, err)
				break
			}
			shape := st.in
			if op.Backward {
				shape = st.out
			}
			if !slices.Equal(t.Shape, append([]int{n}, shape...)) {
				opErr = fmt.Errorf("%v: tensor of shape %v, want %v", op, t.Shape, append([]int{n}, shape...))
				break
			}
			in = t
		}
		if opErr != nil {
			break
		}
		t0 := time.Now()
		clk := startOp()
		var result *tensor.Tensor
		if !op.Backward {
			out, s := st.model.Forward(nn.Ctx{Train: true}, in)
			states[op.Micro] = s
			if st.last() {
				loss, dl := nn.SoftmaxCrossEntropy(out, y[offs[op.Micro]:offs[op.Micro+1]])
				wgt := float32(n) / float32(total)
				tensor.Scale(wgt, dl.Data)
				dlogits[op.Micro] = dl
				resp.Loss += float64(loss) * float64(wgt)
				for i, p := range nn.Argmax(out) {
					if p == y[offs[op.Micro]+i] {
						resp.Correct++
					}
				}
			}
			result = out
		} else {
			result = st.model.Backward(states[op.Micro], in)
			states[op.Micro], dlogits[op.Micro] = nil, nil
		}
		wl, c := clk.stop()
		cpu += c
		// The emulated device finishes the op, then its result leaves.
		w.throttle(ctx, wl, c)
		compute += time.Since(t0)
		switch {
		case !op.Backward && !st.last():
			fwd.send(op.Micro, result)
		case op.Backward && !st.first():
			bwd.send(op.Micro, result)
		}
		if err := ctx.Err(); err != nil {
			opErr = context.Cause(ctx)
			break
		}
	}
	var comm time.Duration
	for _, s := range []*sender{fwd, bwd} {
		if s == nil {
			continue
		}
		d, err := s.finish()
		comm += d
		if opErr == nil && err != nil {
			opErr = err
		}
	}
	if opErr != nil {
		return iterResp{}, opErr
	}
	for _, p := range st.params {
		for _, g := range p.Grad.Data {
			resp.GradSq += float64(g) * float64(g)
		}
	}
	resp.Compute, resp.Idle, resp.Comm, resp.CPU = compute.Seconds(), idle.Seconds(), comm.Seconds(), cpu.Seconds()
	resp.Wall = time.Since(start).Seconds()
	return resp, nil
}

// rows returns rows [lo, hi) of x, sharing its memory.
func rows(x *tensor.Tensor, lo, hi int) *tensor.Tensor {
	per := x.Len() / x.Shape[0]
	shape := append([]int{hi - lo}, x.Shape[1:]...)
	return tensor.FromSlice(x.Data[lo*per:hi*per], shape...)
}

// sender ships one direction's tensors of an iteration in order over one
// stream (ProtoActs), on its own goroutine so compute overlaps
// communication. The stream opens with the first tensor; each tensor is
// flushed as soon as it is queued, without waiting for an answer.
type sender struct {
	ch   chan senderItem
	done chan struct{}
	comm time.Duration
	err  error
}

type senderItem struct {
	micro int
	t     *tensor.Tensor
}

// flusher is what CallStream's writer offers to push a frame out now.
type flusher interface{ Flush() error }

func (w *Worker) startSender(ctx context.Context, to peer.AddrInfo, req iterReq, backward bool, m int, fail context.CancelCauseFunc) *sender {
	s := &sender{ch: make(chan senderItem, m), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		first, ok := <-s.ch
		if !ok {
			return
		}
		err := w.host.CallStream(ctx, to, ProtoActs, func(wr io.Writer) error {
			for it := first; ; {
				b, err := encodeMsg(actMsg{Gen: req.Gen, Iter: req.Iter, Micro: it.micro, Backward: backward}, []wire.Named{{Name: "t", Tensor: it.t}})
				if err != nil {
					return err
				}
				t0 := time.Now()
				if _, err := wr.Write(binary.BigEndian.AppendUint32(nil, uint32(len(b)))); err != nil {
					return err
				}
				if _, err := wr.Write(b); err != nil {
					return err
				}
				if f, ok := wr.(flusher); ok {
					if err := f.Flush(); err != nil {
						return err
					}
				}
				s.comm += time.Since(t0)
				if it, ok = <-s.ch; !ok {
					return nil
				}
			}
		}, nil)
		if err != nil {
			s.err = fmt.Errorf("send to %s: %w", to.ID.ShortString(), err)
			fail(s.err)
			for range s.ch { // drain what the schedule still queues
			}
		}
	}()
	return s
}

// send queues a tensor; it never blocks (the channel holds a whole
// iteration).
func (s *sender) send(micro int, t *tensor.Tensor) { s.ch <- senderItem{micro, t} }

// finish waits until everything queued is sent and received.
func (s *sender) finish() (time.Duration, error) {
	close(s.ch)
	<-s.done
	return s.comm, s.err
}

// onCommit steps the optimizer over the gradients of a finished iteration.
func (w *Worker) onCommit(ctx context.Context, b []byte) ([]byte, error) {
	var req commitReq
	if _, err := decodeMsg(b, &req, wire.Limits{}); err != nil {
		return nil, err
	}
	w.runMu.Lock()
	defer w.runMu.Unlock()
	st := w.st
	if st == nil || st.req.Gen != req.Gen || st.ready != req.Iter {
		return nil, fmt.Errorf("pipeline: commit of iteration %d in generation %d does not match the worker's state", req.Iter, req.Gen)
	}
	if !(req.LR > 0) || !(req.Scale > 0) || math.IsInf(req.LR+req.Scale, 0) {
		return nil, fmt.Errorf("pipeline: bad commit lr %v scale %v", req.LR, req.Scale)
	}
	t0 := time.Now()
	clk := startOp()
	if req.Scale != 1 {
		for _, p := range st.params {
			tensor.Scale(float32(req.Scale), p.Grad.Data)
		}
	}
	st.opt.SetLR(req.LR)
	st.opt.Step()
	st.opt.ZeroGrad()
	wall, cpu := clk.stop()
	w.throttle(ctx, wall, cpu)
	st.ready, st.iter = -1, req.Iter+1
	return encodeMsg(commitResp{Seconds: time.Since(t0).Seconds()}, nil)
}

// onAbort stops a running iteration of the given generation.
func (w *Worker) onAbort(_ context.Context, b []byte) ([]byte, error) {
	var req abortReq
	if _, err := decodeMsg(b, &req, wire.Limits{}); err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.aborted = req
	if w.gen == req.Gen && w.cancelIter != nil {
		w.cancelIter(fmt.Errorf("pipeline: iteration %d aborted by the coordinator", req.Iter))
	}
	w.mu.Unlock()
	return nil, nil
}

// onFetch returns the stage's weights and optimizer state.
func (w *Worker) onFetch(_ context.Context, b []byte) ([]byte, error) {
	var req fetchReq
	if _, err := decodeMsg(b, &req, wire.Limits{}); err != nil {
		return nil, err
	}
	w.runMu.Lock()
	defer w.runMu.Unlock()
	st := w.st
	if st == nil || st.req.Gen != req.Gen {
		return nil, fmt.Errorf("pipeline: no stage of generation %d to fetch", req.Gen)
	}
	os := st.opt.State()
	snap := Snapshot{Params: nn.ExportParams(st.params), Optim: os.Tensors, Step: os.Step}
	return encodeMsg(fetchResp{Step: os.Step, Iter: st.iter}, mapNamed(snap.tensors()))
}
