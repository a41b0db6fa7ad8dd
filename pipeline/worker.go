package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/swarm"
)

// WorkerConfig configures a stage worker.
type WorkerConfig struct {
	// Name labels the worker in the coordinator's tables (default: its
	// peer ID).
	Name string
	// Join is the coordinator's multiaddr including /p2p/<peer ID>.
	Join string
	// Transport, if set, is the network the worker uses (e.g. a memnet
	// peer); the caller closes it. Otherwise the worker starts a libp2p
	// host from Host and closes it in Close.
	Transport p2p.Transport
	// Host configures that host: listen addresses (default
	// /ip4/127.0.0.1/tcp/0), announce addresses, identity file (default an
	// ephemeral key), relays and NAT traversal. The worker sets its message
	// limits, idle timeout and logger.
	Host p2p.Config
	// Slowdown ≥ 1 emulates a slower device: after each piece of compute
	// that kept it busy for c (see opClock), the worker sleeps (Slowdown−1)·c
	// (swarm.Device.Throttle). 0 means 1. Ignored when Device is set.
	Slowdown float64
	// Steady makes the emulated device's speed steady: the busy time the
	// slowdown multiplies is the median of the op's recent executions on
	// this worker (the same layers, direction and micro-batch size) rather
	// than this execution's, so that the host's second-to-second variation
	// does not reach the emulated device (see steadyCosts). StageTiming.CPU
	// then reports those busy times.
	Steady bool
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
	// MaxMessageBytes bounds one setup or iteration message from the
	// coordinator (default DefaultMaxMessageBytes); a stage's weights
	// travel in one. Plain calls on the host the worker starts are bounded
	// to 8 MiB + 64 KiB, activations to a batch of the stage's shape.
	MaxMessageBytes int
	// Executor, if set, computes the worker's layers in PyTorch
	// (bridge.Executor started with bridge.StageModule): its stages,
	// commits, fetches and profiles go there; the caller closes it.
	Executor StageExecutor
	// Logger receives events; nil discards them.
	Logger *slog.Logger
	// Reach, if set, is called with where others reach the worker's own
	// host (not an injected Transport), now and whenever AutoNAT's verdict
	// changes, until the worker closes.
	Reach func(p2p.Reach)
	// Metrics, if set, receives the worker's Prometheus collector (its
	// iterations' compute, communication and idle time; see
	// docs/observability.md), unregistered by Close. Nil: no metrics. The
	// worker's own host reports through Host.Metrics.
	Metrics prometheus.Registerer
}

// Worker serves one pipeline stage: it holds a contiguous block of a
// model's layers with their optimizer, runs forward and backward passes of
// micro-batches as the coordinator's schedule says, and exchanges
// activations and gradients directly with its neighbour stages.
type Worker struct {
	cfg   WorkerConfig
	tr    p2p.Transport
	own   *p2p.Host // the host the worker started, or nil
	log   *slog.Logger
	coord peer.AddrInfo
	dial  actDialer // how the executor reaches its neighbours

	dev    *swarm.Device  // emulated device: slowdown and pause gate
	steady *steadyCosts   // with WorkerConfig.Steady; guarded by runMu
	late   *lateness      // with WorkerConfig.Steady; guarded by runMu
	m      *workerMetrics // nil without WorkerConfig.Metrics

	// controls are the calls only the coordinator may make, by protocol;
	// filled in NewWorker, read-only afterwards.
	controls map[protocol.ID]controlHandler

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

var errStopped = errors.New("pipeline: worker stopped")

// ErrCoordinatorAddr is wrapped by RunWorker's error when WorkerConfig.Join
// is not a coordinator's multiaddr.
var ErrCoordinatorAddr = errors.New("pipeline: bad coordinator address")

// NewWorker starts a worker's handlers on cfg.Transport or on a libp2p
// host of its own. Call Run to join the
// coordinator and serve, and Close to stop.
func NewWorker(ctx context.Context, cfg WorkerConfig) (*Worker, error) {
	cfg.setDefaults()
	dev := cfg.Device
	if dev == nil {
		var err error
		if dev, err = swarm.NewDevice("pipeline", cfg.Slowdown, max(cfg.MemCap, 0)); err != nil {
			return nil, fmt.Errorf("pipeline: %w", err)
		}
	}
	coord, err := cfg.check()
	if err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, tr: cfg.Transport, log: cfg.Logger, coord: *coord, dev: dev, box: newInbox(0, nil, nil), stop: make(chan struct{}), controls: map[protocol.ID]controlHandler{}}
	if cfg.Steady {
		w.steady, w.late = &steadyCosts{}, &lateness{}
	}
	if w.tr == nil {
		hcfg := cfg.hostConfig()
		h, err := p2p.New(ctx, hcfg)
		if err != nil {
			return nil, fmt.Errorf("pipeline: worker host: %w", err)
		}
		w.tr, w.own = h, h
		if cfg.Reach != nil {
			go func() { _ = h.WatchReach(context.WithoutCancel(ctx), cfg.Reach) }()
		}
	}
	w.dial = transportDialer(w.tr)
	if cfg.Metrics != nil {
		if w.m, err = newWorkerMetrics(cfg.Metrics); err != nil {
			w.Close()
			return nil, err
		}
	}
	if w.cfg.Name == "" {
		w.cfg.Name = p2p.ShortID(w.tr.ID().String())
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
	w.handle(ProtoAct, func(_ context.Context, from peer.ID, b []byte) ([]byte, error) { return nil, w.onAct(from, b) })
	if st, ok := w.tr.(streamer); ok {
		st.SetStreamHandler(ProtoActs, w.onActs)
		st.SetStreamHandler(ProtoControl, w.onControl)
	}
	return w, nil
}

// handle registers a handler that answers while the worker runs.
func (w *Worker) handle(p protocol.ID, h p2p.Handler) {
	w.tr.SetHandler(p, func(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
		if w.stopped() {
			return nil, errStopped
		}
		return h(ctx, from, req)
	})
}

// stopped reports whether shutdown or Close was called.
func (w *Worker) stopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// control registers a handler that only the coordinator may call, as a
// plain call and as a call over ProtoControl.
func (w *Worker) control(p protocol.ID, h controlHandler) {
	w.controls[p] = h
	w.handle(p, func(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
		if from != w.coord.ID {
			return nil, fmt.Errorf("pipeline: %s accepts calls from the coordinator only", p)
		}
		return h(ctx, req)
	})
}

// ID is the worker's peer ID.
func (w *Worker) ID() peer.ID { return w.tr.ID() }

// SetSlowdown changes the emulated slowdown factor (≥ 1) while running,
// e.g. to emulate a device that becomes loaded.
func (w *Worker) SetSlowdown(f float64) { w.dev.SetSlowdown(f) }

// throttle emulates the device after an op that took wall time, busy of
// it computing (see opClock), on this machine: the emulated device runs
// the op in slowdown·busy, so the worker sleeps until that much time has
// passed since the op started. The sleep goes through
// swarm.Device.Throttle, which sleeps (slowdown−1)·d, with
// d = (slowdown·busy − wall)/(slowdown−1); it also waits while the device
// is paused. Aiming at slowdown·busy rather than slowdown·wall keeps time
// lost waiting for a core (other processes on the same machine, including
// co-located workers) out of the emulated speed, as long as the worker
// gets at least 1/slowdown of a core. A steady device also asks for its
// sleep to end early by its recent wake-up lateness (see lateness). runMu
// must be held.
func (w *Worker) throttle(ctx context.Context, wall, busy time.Duration) {
	f := w.dev.Slowdown()
	if f <= 1 {
		w.dev.Checkpoint(ctx)
		return
	}
	sleep := time.Duration(f*float64(busy) - float64(wall))
	if sleep <= 0 {
		w.dev.Checkpoint(ctx) // the op already took its emulated time
		return
	}
	asked := sleep
	if w.late != nil {
		asked = w.late.aim(sleep)
	}
	t0 := time.Now()
	w.dev.Throttle(ctx, time.Duration(float64(asked)/(f-1))) // returns early only when ctx ends, which callers check
	if w.late != nil && ctx.Err() == nil {
		w.late.observe(asked, time.Since(t0))
	}
}

// emulatedBusy is the busy time the device emulates for an execution of op
// k that kept this machine busy for busy: busy itself, or with
// WorkerConfig.Steady the op's steady busy time; cold says the op is of a
// freshly built stage's first iteration (steadyCosts.observeCold). runMu
// must be held.
func (w *Worker) emulatedBusy(k opKey, busy time.Duration, cold bool) time.Duration {
	switch {
	case w.steady == nil:
		return busy
	case cold:
		return w.steady.observeCold(k, busy)
	}
	return w.steady.observe(k, busy)
}

// setDefaults fills in the zero fields of cfg that have defaults.
func (cfg *WorkerConfig) setDefaults() {
	if cfg.Slowdown == 0 {
		cfg.Slowdown = 1
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
	if len(cfg.Host.ListenAddrs) == 0 {
		cfg.Host.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// check refuses a negative memory cap and a Join that is not a
// coordinator's multiaddr, and returns the coordinator's address.
func (cfg *WorkerConfig) check() (*peer.AddrInfo, error) {
	if cfg.MemCap < 0 {
		return nil, fmt.Errorf("pipeline: negative memory cap %d", cfg.MemCap)
	}
	coord, err := peer.AddrInfoFromString(cfg.Join)
	if err != nil {
		return nil, fmt.Errorf("%w %q: want a multiaddr ending in /p2p/<peer id>: %w", ErrCoordinatorAddr, cfg.Join, err)
	}
	return coord, nil
}

// hostConfig is the configuration of the worker's own host (cfg with its
// defaults set): Host with the worker's message limits, idle timeout and
// logger.
func (cfg *WorkerConfig) hostConfig() p2p.Config {
	hcfg := cfg.Host
	// Plain calls are small (heartbeats, link probes); the coordinator's
	// calls come over control streams, activations over streams of their
	// own, each bounded once the sender is known.
	hcfg.MaxMessageBytes = callBytes
	hcfg.MaxStreamBytes = int64(cfg.MaxMessageBytes) * maxMicro
	// An activation stream stays open for a whole iteration and may wait
	// for a slow neighbour's compute between messages.
	hcfg.IdleTimeout = streamIdleTimeout
	hcfg.Logger = cfg.Logger
	return hcfg
}

// Close stops the worker: its handlers refuse calls from now on, a running
// iteration ends, and the host it started, if any, closes with its
// connections. A given Transport stays open.
func (w *Worker) Close() error {
	w.stopOnce.Do(func() { close(w.stop) })
	if w.m != nil {
		w.m.reg.Unregister(w.m)
	}
	w.mu.Lock()
	if w.cancelIter != nil {
		w.cancelIter(errStopped)
	}
	w.mu.Unlock()
	if w.own != nil {
		return w.own.Close()
	}
	return nil
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
		_, err := w.tr.Call(cctx, w.coord, ProtoPing, nil)
		cancel()
		if err == nil {
			misses = 0
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err() // stopping: the ping failed because of it
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
	for _, a := range w.tr.AddrInfo().Addrs {
		req.Addrs = append(req.Addrs, a.String())
	}
	b, err := encodeMsg(req, nil)
	if err != nil {
		return err
	}
	var lastErr error
	for attempt := range 20 {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := w.tr.Call(cctx, w.coord, ProtoRegister, b)
		cancel()
		if err == nil {
			var r registerResp
			if err := decodeHeader(resp, &r); err != nil {
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
