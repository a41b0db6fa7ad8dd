package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/swarm"
	"github.com/skyhive/skyhive/wire"
)

// CoordinatorConfig configures a Coordinator's network.
type CoordinatorConfig struct {
	// Transport, if set, is the network the coordinator uses (e.g. a
	// memnet peer, or a node's libp2p host started from HostConfig); the
	// caller closes it. Otherwise the coordinator starts a libp2p host
	// from Host and closes it in Close.
	Transport p2p.Transport
	// Host configures that host: listen addresses (default
	// /ip4/127.0.0.1/tcp/0), announce addresses, identity file (keeps the
	// peer ID across restarts, so workers can be started with a fixed
	// --join address), relays and NAT traversal. Its MaxMessageBytes and
	// Logger come from the fields below.
	Host p2p.Config
	// MaxMessageBytes bounds one message of a call to a worker or its
	// reply (default DefaultMaxMessageBytes); a stage's weights travel in
	// one. Plain calls on the host the coordinator starts (registrations,
	// heartbeats) are bounded to 8 MiB + 64 KiB.
	MaxMessageBytes int
	// MaxWorkers bounds the workers the coordinator accepts (default
	// DefaultMaxWorkers, at most 1024). Each peer ID holds one
	// registration; a worker that joins again replaces its own. Once the
	// table is full, further peers are refused, except into the place of a
	// worker that died before it was ever profiled.
	MaxWorkers int
	// Logger receives events; nil discards them.
	Logger *slog.Logger
	// Network, if set, emulates the links: every connection between the
	// coordinator and the workers and between workers goes through a netem
	// loopback proxy of the pair (workers are keyed by name, which must be
	// unique, the coordinator by CoordinatorKey). Workers must name a
	// region of it; the coordinator is in Region. Local workers only: the
	// proxies run in the coordinator's process. The proxies carry TCP, so
	// this needs a libp2p host (its own, or a Transport that is one); on
	// memnet, emulate links with memnet.WithLink instead.
	Network *netem.Network
	Region  string
	// Metrics, if set, receives the coordinator's Prometheus collector
	// (per-stage compute, communication and idle time, re-plans, workers,
	// and the skyhive_train_* family; see docs/observability.md),
	// unregistered by Close. Nil: no metrics. The coordinator's own host
	// reports through Host.Metrics.
	Metrics prometheus.Registerer
}

// WorkerInfo describes a registered worker.
type WorkerInfo struct {
	Index    int           `json:"index"`
	Name     string        `json:"name"`
	Peer     peer.AddrInfo `json:"-"`
	Slowdown float64       `json:"slowdown"`
	MemCap   int64         `json:"mem_cap"`
	// Region is the network region the worker declared ("" if none).
	Region string `json:"region,omitempty"`
	// Speed is the worker's effective FLOP/s: profiled at first, then as
	// measured during training.
	Speed float64 `json:"speed"`
	Alive bool    `json:"alive"`
	// real is the worker's own address; Peer is how the coordinator
	// reaches it (a route under emulation).
	real peer.AddrInfo
}

// peerInfo reads w.Peer under c's lock.
func (w *WorkerInfo) peerInfo(c *Coordinator) peer.AddrInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return w.Peer
}

// Coordinator accepts workers and drives pipeline training sessions over
// them. Its methods are safe for concurrent use.
type Coordinator struct {
	tr   p2p.Transport
	own  *p2p.Host // the host the coordinator started, or nil
	host *p2p.Host // the libp2p host it runs on, own or given, or nil
	log  *slog.Logger
	// routes hands out the addresses peers reach each other at: direct,
	// or through the emulated links' proxies.
	routes router

	maxWorkers int
	maxMsg     int           // bound of a control message (a reply over ProtoControl)
	m          *coordMetrics // nil without CoordinatorConfig.Metrics

	mu      sync.Mutex
	workers []*WorkerInfo
	changed chan struct{} // closed and replaced when workers change
}

// DefaultMaxWorkers is CoordinatorConfig.MaxWorkers's default.
const DefaultMaxWorkers = 256

// ErrCoordinatorFull is wrapped by the error a worker gets when the
// coordinator already holds CoordinatorConfig.MaxWorkers workers.
var ErrCoordinatorFull = errors.New("pipeline: coordinator full")

// NewCoordinator starts the coordinator on cfg.Transport or on a libp2p
// host of its own. Workers join it with `skyhive worker --join` one of
// Addrs.
func NewCoordinator(ctx context.Context, cfg CoordinatorConfig) (*Coordinator, error) {
	if _, isHost := cfg.Transport.(*p2p.Host); cfg.Transport != nil && !isHost && cfg.Network != nil {
		return nil, errors.New("pipeline: emulated links proxy TCP and need a libp2p host, not a given transport of another kind")
	}
	cfg.setDefaults()
	c := &Coordinator{tr: cfg.Transport, log: cfg.Logger, routes: direct{}, changed: make(chan struct{}), maxWorkers: cfg.MaxWorkers, maxMsg: cfg.MaxMessageBytes}
	c.host, _ = cfg.Transport.(*p2p.Host)
	if c.tr == nil {
		h, err := p2p.New(ctx, cfg.hostConfig())
		if err != nil {
			return nil, fmt.Errorf("pipeline: coordinator host: %w", err)
		}
		c.tr, c.own, c.host = h, h, h
	}
	if cfg.Network != nil {
		if err := cfg.Network.Assign(CoordinatorKey, cfg.Region); err != nil {
			c.Close()
			return nil, fmt.Errorf("pipeline: coordinator region: %w", err)
		}
		c.routes = &emulation{n: cfg.Network}
	}
	if cfg.Metrics != nil {
		var err error
		if c.m, err = newCoordMetrics(c, cfg.Metrics); err != nil {
			c.Close()
			return nil, err
		}
	}
	c.tr.SetHandler(ProtoPing, func(context.Context, peer.ID, []byte) ([]byte, error) { return nil, nil })
	c.tr.SetHandler(ProtoRegister, c.onRegister)
	return c, nil
}

// setDefaults fills in the zero fields of cfg that have defaults.
func (cfg *CoordinatorConfig) setDefaults() {
	if len(cfg.Host.ListenAddrs) == 0 {
		cfg.Host.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.MaxWorkers <= 0 {
		cfg.MaxWorkers = DefaultMaxWorkers
	}
	cfg.MaxWorkers = min(cfg.MaxWorkers, maxStages)
}

// hostConfig is the configuration of the coordinator's host (cfg with its
// defaults set): Host with the coordinator's message limits and logger.
func (cfg *CoordinatorConfig) hostConfig() p2p.Config {
	hcfg := cfg.Host
	// Plain calls (registrations, heartbeats) are small; replies of
	// workers that carry tensors come over control streams.
	hcfg.MaxMessageBytes, hcfg.Logger = callBytes, cfg.Logger
	hcfg.MaxStreamBytes = int64(cfg.MaxMessageBytes) + 1<<20
	return hcfg
}

// HostConfig is the configuration of the libp2p host a coordinator of cfg
// starts for itself: Host (listening on /ip4/127.0.0.1/tcp/0 if it names
// no address) with the coordinator's message limits and logger. A node
// that the coordinator is to run on starts its host from it.
func (cfg CoordinatorConfig) HostConfig() p2p.Config {
	cfg.setDefaults()
	return cfg.hostConfig()
}

// Addrs returns the coordinator's addresses with its peer ID, the values
// workers accept for --join.
func (c *Coordinator) Addrs() []string {
	ai := c.tr.AddrInfo()
	addrs, err := peer.AddrInfoToP2pAddrs(&ai)
	if err != nil {
		return nil
	}
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out
}

// Host returns the libp2p host the coordinator runs on: the one it
// started, or a given Transport that is one (e.g. a node's host); nil on
// a Transport of another kind.
func (c *Coordinator) Host() *p2p.Host { return c.host }

// Transport returns the network the coordinator talks through.
func (c *Coordinator) Transport() p2p.Transport { return c.tr }

// Close stops the coordinator's own host, if it started one, and its
// emulated links. A given Transport stays open.
func (c *Coordinator) Close() error {
	var err error
	if c.m != nil {
		c.m.close()
		c.m = nil
	}
	if c.own != nil {
		err = c.own.Close()
	}
	c.routes.close()
	return err
}

// onRegister admits a worker: one registration per peer ID (a worker
// that joins again replaces its own), at most maxWorkers of them. A
// newcomer may take the place of a worker that died before it was ever
// profiled (it holds no layers and is in no plan), so registrations that
// never complete profiling do not keep their places.
func (c *Coordinator) onRegister(_ context.Context, from peer.ID, b []byte) ([]byte, error) {
	// Refuse a full coordinator before parsing anything.
	c.mu.Lock()
	_, _, err := c.placeLocked(from)
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var req registerReq
	if err := decodeHeader(b, &req); err != nil {
		return nil, err
	}
	if !(req.Slowdown >= 1) || math.IsInf(req.Slowdown, 0) || req.MemCap < 0 || len(req.Name) > 64 || !utf8.ValidString(req.Name) || len(req.Addrs) > maxAddrs || len(req.Region) > 64 || !utf8.ValidString(req.Region) {
		return nil, fmt.Errorf("pipeline: bad registration %+v", req)
	}
	ai := peer.AddrInfo{ID: from}
	for _, s := range req.Addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("pipeline: address %q: %w", s, err)
		}
		ai.Addrs = append(ai.Addrs, a)
	}
	if req.Name == "" {
		req.Name = p2p.ShortID(from.String())
	}
	// Names label plans and tables, so they must be unique: several workers
	// on one host (srun --ntasks-per-node>1) all send its host name.
	c.mu.Lock()
	req.Name = uniqueName(req.Name, func(n string) bool {
		for _, w := range c.workers {
			if w.Name == n && w.Peer.ID != from {
				return true
			}
		}
		return false
	})
	c.mu.Unlock()
	reach, err := c.routes.admit(req.Name, req.Region, ai)
	if err != nil {
		return nil, err
	}
	if c.routes.pinned() {
		pinAddrs(c.tr, from, reach.Addrs)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	idx, known, err := c.placeLocked(from)
	if err != nil {
		return nil, err
	}
	rec := &WorkerInfo{Index: idx, Name: req.Name, Peer: reach, real: ai, Slowdown: req.Slowdown, MemCap: req.MemCap, Region: req.Region, Alive: true}
	switch {
	case known:
		w := c.workers[idx]
		w.Peer, w.real, w.Name, w.Slowdown, w.MemCap, w.Region, w.Alive, w.Speed = reach, ai, req.Name, req.Slowdown, req.MemCap, req.Region, true, 0
	case idx < len(c.workers):
		c.log.Info("pipeline: place of a worker that was never profiled reused", "index", idx, "name", c.workers[idx].Name)
		c.workers[idx] = rec
	default:
		c.workers = append(c.workers, rec)
	}
	c.log.Info("pipeline: worker joined", "index", idx, "name", req.Name, "slowdown", req.Slowdown)
	close(c.changed)
	c.changed = make(chan struct{})
	return encodeMsg(registerResp{Index: idx}, nil)
}

// placeLocked returns the index a registration of from takes: its own
// (known), that of a worker that died without being profiled, or a new
// one; it fails when the coordinator is full. c.mu is held.
func (c *Coordinator) placeLocked(from peer.ID) (idx int, known bool, err error) {
	free := -1
	for _, w := range c.workers {
		if w.Peer.ID == from {
			return w.Index, true, nil
		}
		if free < 0 && !w.Alive && w.Speed == 0 {
			free = w.Index
		}
	}
	switch {
	case len(c.workers) < c.maxWorkers:
		return len(c.workers), false, nil
	case free >= 0:
		return free, false, nil
	}
	return 0, false, fmt.Errorf("%w: %d workers registered, the most it accepts (CoordinatorConfig.MaxWorkers)", ErrCoordinatorFull, c.maxWorkers)
}

// uniqueName returns name, or name-2, name-3, … the first that is not
// taken.
func uniqueName(name string, taken func(string) bool) string {
	n := name
	for i := 2; taken(n); i++ {
		n = name + "-" + strconv.Itoa(i)
	}
	return n
}

// Workers returns copies of the registered workers' descriptions.
func (c *Coordinator) Workers() []WorkerInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]WorkerInfo, len(c.workers))
	for i, w := range c.workers {
		out[i] = *w
	}
	return out
}

// LiveWorkers is the number of live registered workers.
func (c *Coordinator) LiveWorkers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.liveLocked()
}

// liveLocked counts the live workers; c.mu is held.
func (c *Coordinator) liveLocked() int {
	live := 0
	for _, w := range c.workers {
		if w.Alive {
			live++
		}
	}
	return live
}

var _ swarm.PipelineCoordinator = (*Coordinator)(nil)

// WaitWorkers blocks until at least n live workers have registered.
func (c *Coordinator) WaitWorkers(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		live := c.liveLocked()
		ch := c.changed
		c.mu.Unlock()
		if live >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pipeline: waiting for %d workers (have %d): %w", n, live, ctx.Err())
		case <-ch:
		}
	}
}

// Shutdown asks every live worker to exit.
func (c *Coordinator) Shutdown(ctx context.Context) {
	var wg sync.WaitGroup
	for _, w := range c.Workers() {
		if !w.Alive {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if _, err := c.raw(cctx, w.Peer, ProtoShutdown, nil); err != nil {
				c.log.Debug("pipeline: shutdown", "worker", w.Name, "err", err)
			}
		})
	}
	wg.Wait()
}

// worker returns the live record of worker i.
func (c *Coordinator) worker(i int) *WorkerInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.workers[i]
}

// speed reads w.Speed under c's lock.
func (w *WorkerInfo) speed(c *Coordinator) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return w.Speed
}

// alive reads w.Alive under c's lock.
func (w *WorkerInfo) alive(c *Coordinator) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return w.Alive
}

// setSpeed records a worker's measured speed.
func (c *Coordinator) setSpeed(i int, s float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.workers[i].Speed = s
}

// markDead records that worker i stopped answering.
func (c *Coordinator) markDead(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.workers[i].Alive {
		c.log.Warn("pipeline: worker lost", "index", i, "name", c.workers[i].Name)
	}
	c.workers[i].Alive = false
}

// call sends a message to worker i and decodes the reply header into
// resp; it returns the reply's tensors.
func (c *Coordinator) call(ctx context.Context, i int, proto protocol.ID, req any, ts []wire.Named, resp any, lim wire.Limits) ([]wire.Named, error) {
	b, err := encodeMsg(req, ts)
	if err != nil {
		return nil, err
	}
	w := c.worker(i)
	c.mu.Lock()
	ai := w.Peer
	c.mu.Unlock()
	out, err := c.raw(ctx, ai, proto, b)
	if err != nil {
		return nil, err
	}
	if resp == nil {
		return nil, nil
	}
	if len(out) == 0 {
		return nil, errors.New("pipeline: empty reply")
	}
	return decodeMsg(out, resp, lim)
}

// ping reports whether worker i answers within timeout.
func (c *Coordinator) ping(ctx context.Context, i int, timeout time.Duration) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := c.call(cctx, i, ProtoPing, empty{}, nil, nil, wire.Limits{})
	return err
}
