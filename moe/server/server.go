// Package server hosts Learning@home experts: many experts in one process
// behind the expert RPC of package moe, a batching runtime that groups the
// forward and backward requests of each expert, a per-expert optimizer that
// applies the gradients arriving with backward calls, periodic DHT
// declarations with expiration times, and atomic checkpoints.
//
// A backward call carries the expert's input and the gradient of the loss
// with respect to its output. The server recomputes the forward pass (it
// keeps no activations between calls, so a trainer may never call backward
// at all), backpropagates, takes one optimizer step per backward batch and
// answers with the gradient with respect to the input.
//
// Any peer may call an expert, so nothing a request carries is trusted:
// it is decoded within limits sized to the largest valid request, checked
// in every dimension against the expert's input, its values must be finite
// and bounded, and its working memory is estimated and budgeted before it
// runs. Gradient norms are clipped, a step with non-finite gradients is
// skipped, and an expert whose weights are found non-finite at a
// checkpoint is rolled back to its last good state instead of being saved.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/blocklist"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// Config configures a Server. Zero fields take the defaults shown.
type Config struct {
	// Transport carries the expert RPC (required).
	Transport p2p.Transport
	// DHT, if set, is where experts are declared.
	DHT *dht.Node
	// Experts lists the UIDs to host (see moe.ParseExperts).
	Experts []string
	// Type is TypeFFN (default) or TypeTransformer.
	Type string
	// Hidden is the experts' input and output size (required).
	Hidden int
	// Heads is the attention heads of transformer experts (hidden/64, at
	// least 1).
	Heads int

	// MinBatch is the number of rows a pool waits for before it runs (1);
	// BatchTimeout bounds that wait (2ms). MaxBatch bounds the rows of a
	// batch and of one request (4096).
	MinBatch, MaxBatch int
	BatchTimeout       time.Duration
	// MaxQueue bounds the requests queued per pool (1024).
	MaxQueue int
	// Workers is the number of batches processed at once (1; the tensor
	// engine already uses every core within a batch).
	Workers int

	// LR, WeightDecay and ClipNorm configure each expert's AdamW (1e-3,
	// 0, DefaultClipNorm). ClipNorm bounds the global L2 norm of the
	// gradient of each optimizer step, so no single step can move an
	// expert far; a negative ClipNorm disables clipping. Either way a step
	// whose gradients are not finite is skipped, logged and counted
	// (ExpertStats.SkippedSteps), leaving the weights as they were.
	LR, WeightDecay, ClipNorm float64
	// StepRows makes an expert accumulate the gradients of backward
	// batches until they cover at least this many rows, and then take one
	// optimizer step on their mean (0 or 1: a step after every batch, as
	// in Learning@home). Backward calls are answered at once either way;
	// with many trainers each sending a few rows, a larger StepRows
	// trades update frequency for less noisy steps. Gradients still
	// pending at shutdown are not checkpointed.
	StepRows int
	// Seed determines the initial weights (from the seed and the UID).
	Seed uint64
	// ZeroInit starts each FFN expert's residual branch at zero (the
	// output layer's weights and bias), so that a fresh expert is the
	// identity x ↦ x and an untrained one cannot scramble its inputs; the
	// output layer learns first and the rest follows, as with zero-
	// initialised residual blocks. Only for TypeFFN.
	ZeroInit bool
	// Executor, if set, computes the experts: each expert is the module
	// the executor builds (a PyTorch module, bridge.Executor), trained
	// by its optimizer; Type still sets the input's rank and Hidden its
	// last dimension, ZeroInit and Heads do not apply. Nil: Skyhive's Go
	// experts.
	Executor Executor
	// Lazy creates an expert's weights on its first request, so that
	// servers hosting thousands of rarely used experts use little memory.
	Lazy bool

	// Limits bound decoded requests (default: 16M elements, 4 dims, 4
	// tensors); the server tightens them to the largest valid request (two
	// tensors of the experts' rank and at most MaxBatch rows).
	Limits wire.Limits
	// MaxSeqLen bounds the sequence length of transformer experts' inputs
	// (DefaultMaxSeqLen).
	MaxSeqLen int
	// MaxAbsValue bounds the magnitude of every value of a request's
	// tensors (DefaultMaxAbsValue); larger values are refused like NaN
	// and Inf, so that no sum of the forward or backward pass overflows
	// float32.
	MaxAbsValue float64
	// BlockFor is how long a peer that sent a poisoned request (values
	// that are not finite or over MaxAbsValue) is refused, when the
	// transport can (p2p.Host.BlockList): 10 min by default, negative: never.
	BlockFor time.Duration
	// RequestMemory bounds the working memory (activations, their
	// gradients, attention weights) that one request, and one batch of
	// requests, may need; it is estimated from the input's shape before
	// anything runs, and larger requests are refused (default: the larger
	// of DefaultRequestMemory and the need of the largest valid request,
	// MaxBatch rows for FFN experts or one sequence of MaxSeqLen tokens for
	// transformer experts).
	RequestMemory int64
	// QueueMemory bounds the bytes of the input tensors of all requests
	// queued or running at once (DefaultQueueMemory); requests beyond it
	// are refused as busy. A server's memory thus stays below its weights
	// plus QueueMemory plus Workers × RequestMemory.
	QueueMemory int64
	// MemoryBudget, when set, is the memory the whole process may use
	// (package memlimit finds the kernel's limits): RequestMemory and
	// QueueMemory are lowered to fit it (PlanMemory), and the experts
	// (all of them, unless Lazy) must leave room for requests.
	MemoryBudget int64
	// Codec encodes responses (CodecNone).
	Codec wire.Codec

	// DeclareEvery is how often the experts are declared on the DHT (30s);
	// Expiration is how long a declaration stays valid (2×DeclareEvery).
	DeclareEvery, Expiration time.Duration
	// NoUIDRecords skips the record under each full UID and declares only
	// the prefix records the beam search needs (fewer DHT stores).
	NoUIDRecords bool
	// DeclareParallel bounds concurrent DHT stores (16).
	DeclareParallel int

	// CheckpointPath, if set, is the safetensors file holding the experts'
	// weights and optimizer state: loaded on start if it exists, written
	// atomically every CheckpointEvery (0: only on Close) and on Close.
	CheckpointPath  string
	CheckpointEvery time.Duration

	// FailRate makes each request fail with this probability, to
	// simulate unreliable experts (0).
	FailRate float64

	// Logger receives declaration and checkpoint errors; nil discards.
	Logger *slog.Logger
	// Metrics, if set, receives the server's Prometheus collector
	// (requests, batch sizes, queue, latencies, skipped steps; see
	// docs/observability.md), unregistered by Close. Nil: no metrics.
	Metrics prometheus.Registerer
}

func (c *Config) defaults() error {
	if c.Transport == nil {
		return errors.New("moe/server: Config.Transport is required")
	}
	if c.Type == "" {
		c.Type = TypeFFN
	}
	if c.Type != TypeFFN && c.Type != TypeTransformer {
		return fmt.Errorf("moe/server: unknown expert type %q (want %s or %s)", c.Type, TypeFFN, TypeTransformer)
	}
	if c.Hidden < 1 || c.Hidden > 1<<16 {
		return fmt.Errorf("moe/server: hidden size %d out of range", c.Hidden)
	}
	if c.Heads <= 0 {
		c.Heads = max(1, c.Hidden/64)
	}
	if c.ZeroInit && c.Type != TypeFFN {
		return fmt.Errorf("moe/server: ZeroInit needs %s experts, not %s", TypeFFN, c.Type)
	}
	if c.Type == TypeTransformer && c.Hidden%c.Heads != 0 {
		return fmt.Errorf("moe/server: hidden %d not divisible by %d heads", c.Hidden, c.Heads)
	}
	if len(c.Experts) == 0 {
		return errors.New("moe/server: no experts to host")
	}
	for _, uid := range c.Experts {
		if _, _, err := moe.SplitUID(uid); err != nil {
			return err
		}
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MinBatch, 1)
	def(&c.MaxBatch, 4096)
	def(&c.MaxQueue, 1024)
	def(&c.Workers, 1)
	def(&c.DeclareParallel, 16)
	if c.BatchTimeout <= 0 {
		c.BatchTimeout = 2 * time.Millisecond
	}
	if c.LR <= 0 {
		c.LR = 1e-3
	}
	if c.DeclareEvery <= 0 {
		c.DeclareEvery = 30 * time.Second
	}
	if c.Expiration <= 0 {
		c.Expiration = 2 * c.DeclareEvery
	}
	if c.Limits.MaxElements <= 0 {
		c.Limits.MaxElements = 1 << 24
	}
	if c.Limits.MaxDims <= 0 {
		c.Limits.MaxDims = 4
	}
	if c.Limits.MaxTensors <= 0 {
		c.Limits.MaxTensors = 4
	}
	if c.ClipNorm == 0 {
		c.ClipNorm = DefaultClipNorm
	}
	def(&c.MaxSeqLen, DefaultMaxSeqLen)
	if c.BlockFor == 0 {
		c.BlockFor = DefaultBlockFor
	}
	if c.MaxAbsValue <= 0 {
		c.MaxAbsValue = DefaultMaxAbsValue
	}
	if math.IsNaN(c.ClipNorm) || math.IsNaN(c.MaxAbsValue) {
		return errors.New("moe/server: ClipNorm and MaxAbsValue must be numbers")
	}
	if c.RequestMemory <= 0 {
		largest := []int{c.MaxBatch, c.Hidden}
		if c.Type == TypeTransformer {
			largest = []int{1, c.MaxSeqLen, c.Hidden}
		}
		c.RequestMemory = max(DefaultRequestMemory, c.workBytes(largest, true))
	}
	if c.QueueMemory <= 0 {
		c.QueueMemory = DefaultQueueMemory
	}
	if c.MemoryBudget > 0 {
		var experts int64
		if !c.Lazy && c.Executor == nil { // an executor's experts live in its process
			experts = expertBytes(len(c.Experts), c.Type, c.Hidden)
		}
		p, err := PlanMemory(c.MemoryBudget, experts)
		if err != nil {
			return fmt.Errorf("moe/server: %w", err)
		}
		c.QueueMemory = min(c.QueueMemory, p.Queue)
		c.RequestMemory = min(c.RequestMemory, p.Work/int64(c.Workers))
	}
	if c.FailRate < 0 || c.FailRate >= 1 {
		return fmt.Errorf("moe/server: FailRate %v not in [0, 1)", c.FailRate)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Server hosts experts. Create it with New, stop it with Close.
type Server struct {
	cfg     Config
	limits  wire.Limits // cfg.requestLimits()
	experts map[string]*expert
	order   []string
	rt      *runtime
	start   time.Time
	m       *serverMetrics // nil without Config.Metrics

	failMu  sync.Mutex
	failRng *rand.Rand

	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
	// saveMu serializes Save, which rotates the previous generation.
	saveMu sync.Mutex

	declRound    sync.Mutex
	lastExp      time.Time
	declMu       sync.Mutex
	declared     time.Time
	declareFails int
	// declareRefused counts declarations every replica refused, and
	// lastRefused those of the last round.
	declareRefused, lastRefused int
}

// New loads the checkpoint if there is one, starts the runtime workers, the
// declaration and checkpoint loops, and registers the RPC handlers.
func New(cfg Config) (*Server, error) {
	return NewContext(context.Background(), cfg)
}

// NewContext is New whose setup (creating the experts' weights, loading the
// checkpoint) stops with ctx's error when ctx is done, so that a server of
// many large experts can be interrupted while it starts. ctx bounds only
// the setup: stop the running server with Close.
func NewContext(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     cfg,
		experts: make(map[string]*expert, len(cfg.Experts)),
		order:   slices.Clone(cfg.Experts),
		start:   time.Now(),
		failRng: rand.New(rand.NewPCG(cfg.Seed, 0xfa11)),
	}
	s.limits = s.cfg.requestLimits()
	s.rt = newRuntime(&s.cfg)
	for _, uid := range s.order {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("moe/server: setup interrupted: %w", err)
		}
		if s.experts[uid] != nil {
			return nil, fmt.Errorf("moe/server: expert %s listed twice", uid)
		}
		e := newExpert(uid, &s.cfg)
		if !cfg.Lazy {
			if cfg.Executor != nil {
				if err := e.build(ctx); err != nil {
					return nil, fmt.Errorf("moe/server: %w", err)
				}
			} else {
				e.materialize()
			}
		}
		s.experts[uid] = e
	}
	if cfg.CheckpointPath != "" {
		if err := s.load(cfg.CheckpointPath); err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("moe/server: setup interrupted: %w", err)
		}
	}
	if cfg.Metrics != nil {
		var err error
		if s.m, err = newServerMetrics(s, cfg.Metrics); err != nil {
			return nil, err
		}
		s.rt.m = s.m
	}
	run, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for range cfg.Workers {
		s.wg.Go(func() { s.rt.work(run) })
	}
	if cfg.DHT != nil {
		s.wg.Go(func() { s.declareLoop(run) })
	}
	if cfg.CheckpointPath != "" && cfg.CheckpointEvery > 0 {
		s.wg.Go(func() { s.checkpointLoop(run) })
	}
	t := cfg.Transport
	t.SetHandler(moe.ForwardProtocol, s.handleForward)
	t.SetHandler(moe.BackwardProtocol, s.handleBackward)
	t.SetHandler(moe.InfoProtocol, s.handleInfo)
	t.SetHandler(moe.StatsProtocol, s.handleStats)
	return s, nil
}

// UIDs lists the hosted experts.
func (s *Server) UIDs() []string { return slices.Clone(s.order) }

// Close stops serving, fails queued requests, waits for the workers and
// writes a final checkpoint if configured. It does not close the transport
// or the DHT node, which belong to the caller.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if s.m != nil {
			s.m.reg.Unregister(s.m)
		}
		s.rt.close()
		s.cancel()
		s.wg.Wait()
		if s.cfg.CheckpointPath != "" {
			s.closeErr = s.Save(s.cfg.CheckpointPath)
		}
	})
	return s.closeErr
}

// request decodes a call for one of the hosted experts. The expert is
// looked up before any tensor is decoded, and every tensor's shape is
// checked against the expert's input, and the working memory of a forward
// or backward pass (as backward says) on it against the per-request
// budget, before its data is allocated. On error, the expert is returned
// if the request named a hosted one.
func (s *Server) request(req []byte, backward bool) (*expert, []wire.Named, error) {
	var e *expert
	_, msg, err := moe.DecodeRequestFor(req, func(uid string) (wire.Limits, error) {
		e = s.experts[uid]
		if e == nil {
			return wire.Limits{}, fmt.Errorf("expert %q is not hosted here", uid)
		}
		lim := s.limits
		lim.Shape = func(shape []int) error {
			if err := s.cfg.checkShape(e.spec, shape); err != nil {
				return fmt.Errorf("expert %s: %w", e.uid, err)
			}
			if err := s.cfg.checkWork(shape, backward); err != nil {
				return fmt.Errorf("expert %s: %w", e.uid, err)
			}
			return nil
		}
		return lim, nil
	})
	if err != nil {
		return e, nil, err // e is nil unless the expert is hosted
	}
	return e, msg, nil
}

func (s *Server) fail() bool {
	if s.cfg.FailRate == 0 {
		return false
	}
	s.failMu.Lock()
	defer s.failMu.Unlock()
	return s.failRng.Float64() < s.cfg.FailRate
}

func (s *Server) handleForward(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
	return s.serve(ctx, from, req, false)
}

func (s *Server) handleBackward(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
	return s.serve(ctx, from, req, true)
}

// blocker is implemented by transports that can refuse a peer for a while
// (p2p.Host).
type blocker interface {
	BlockList() *blocklist.List
}

var _ blocker = (*p2p.Host)(nil)

// serve answers a forward or backward request.
func (s *Server) serve(ctx context.Context, from peer.ID, req []byte, backward bool) ([]byte, error) {
	call, out := "forward", "y"
	if backward {
		call, out = "backward", "dx"
	}
	e, x, dy, work, err := s.parse(req, backward)
	if err != nil {
		if b, ok := s.cfg.Transport.(blocker); ok && errors.Is(err, errPoisoned) && s.cfg.BlockFor > 0 {
			b.BlockList().Block(from, s.cfg.BlockFor)
			err = fmt.Errorf("%w (the sender is blocked for %v)", err, s.cfg.BlockFor)
		}
		return nil, err
	}
	if s.fail() {
		e.recordError(backward)
		return nil, fmt.Errorf("expert %s: simulated failure", e.uid)
	}
	pool := e.fwd
	if backward {
		pool = e.bwd
	}
	y, err := s.rt.submit(ctx, pool, x, dy, work)
	if err != nil {
		if errors.Is(err, errBusy) {
			e.recordError(backward)
		}
		return nil, fmt.Errorf("expert %s: %s: %w", e.uid, call, err)
	}
	return wire.MarshalMessage([]wire.Named{{Name: out, Tensor: y}}, wire.Options{Codec: s.cfg.Codec})
}

// parse decodes a forward or backward request within the server's limits
// and checks it against the expert's real input and the per-request memory
// budget, before anything is allocated or computed for it. It returns the
// expert, the input, the output gradient (backward only) and the working
// memory the request needs.
func (s *Server) parse(req []byte, backward bool) (e *expert, x, dy *tensor.Tensor, work int64, err error) {
	e, msg, err := s.request(req, backward)
	if err != nil {
		if e != nil {
			e.recordError(backward)
		}
		return nil, nil, nil, 0, err
	}
	x = wire.Get(msg, "x")
	call := "forward"
	if backward {
		dy = wire.Get(msg, "dy")
		call = "backward"
	}
	work, err = s.cfg.checkRequest(e, x, dy, backward)
	if err != nil {
		e.recordError(backward)
		return nil, nil, nil, 0, fmt.Errorf("expert %s: %s refused: %w", e.uid, call, err)
	}
	return e, x, dy, work, nil
}

func (s *Server) handleInfo(_ context.Context, _ peer.ID, req []byte) ([]byte, error) {
	e, _, err := s.request(req, false)
	if err != nil {
		return nil, err
	}
	return json.Marshal(e.spec)
}

func (s *Server) handleStats(_ context.Context, _ peer.ID, _ []byte) ([]byte, error) {
	return json.Marshal(s.Stats())
}

// Stats is a snapshot of a server's counters (the StatsProtocol answer).
type Stats struct {
	Peer          string        `json:"peer"`
	UptimeSeconds float64       `json:"uptime_seconds"`
	Experts       []ExpertStats `json:"experts"`
	// LastDeclared is when the last declaration round finished;
	// DeclareFailures counts failed DHT stores, and DeclareRefused those
	// of them that every replica refused (another peer holds the subkey).
	LastDeclared    time.Time `json:"last_declared,omitzero"`
	DeclareFailures int       `json:"declare_failures"`
	DeclareRefused  int       `json:"declare_refused"`
}

// Stats returns the per-expert counters, in the order experts were listed.
func (s *Server) Stats() Stats {
	st := Stats{Peer: s.cfg.Transport.ID().String(), UptimeSeconds: time.Since(s.start).Seconds()}
	for _, uid := range s.order {
		st.Experts = append(st.Experts, s.experts[uid].snapshotStats())
	}
	s.declMu.Lock()
	st.LastDeclared, st.DeclareFailures, st.DeclareRefused = s.declared, s.declareFails, s.declareRefused
	s.declMu.Unlock()
	return st
}

// ExpertWeights returns a copy of one expert's parameters (nil if the
// expert is not hosted or not yet created), for tests and tools.
func (s *Server) ExpertWeights(uid string) map[string]*tensor.Tensor {
	e := s.experts[uid]
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	params, _, _, _ := e.weights()
	return params
}
