package server

import (
	"context"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
)

// expert is one hosted expert: its module, its optimizer and its
// statistics. mu guards the module's weights and the optimizer: it is held
// while a batch runs and while a checkpoint copies the weights.
type expert struct {
	uid  string
	spec moe.Spec
	cfg  *Config

	mu     sync.Mutex
	module nn.Module // nil until first use when Config.Lazy
	opt    *optim.AdamW
	// built says the expert exists in Config.Executor (module and opt
	// stay nil then).
	built bool
	// pendingRows and pendingBatches count the backward batches whose
	// gradients are accumulated but not yet applied (Config.StepRows).
	pendingRows, pendingBatches int

	statsMu sync.Mutex
	stats   ExpertStats

	fwd, bwd *pool
}

func newExpert(uid string, cfg *Config) *expert {
	e := &expert{uid: uid, cfg: cfg, stats: ExpertStats{UID: uid}}
	e.spec = moe.Spec{UID: uid, Type: cfg.Type, Hidden: cfg.Hidden, InputDims: 2}
	if cfg.Type == TypeTransformer {
		e.spec.InputDims = 3
	}
	e.fwd = &pool{expert: e}
	e.bwd = &pool{expert: e, backward: true}
	return e
}

// materialize builds the module and optimizer if they do not exist yet.
// The initial weights depend only on the seed and the UID, so an expert is
// the same whichever server hosts it. The caller holds e.mu.
func (e *expert) materialize() {
	if e.module != nil {
		return
	}
	h := fnv.New64a()
	h.Write([]byte(e.uid))
	rng := rand.New(rand.NewPCG(e.cfg.Seed, h.Sum64()))
	e.module = BuildExpert(e.cfg.Type, e.cfg.Hidden, e.cfg.Heads, rng)
	if ex, ok := e.module.(*nn.Expert); ok && e.cfg.ZeroInit {
		clear(ex.FFN.FC2.W.Value.Data)
		clear(ex.FFN.FC2.B.Value.Data)
	}
	e.opt = optim.NewAdamW(e.module.Params(), optim.AdamWConfig{
		LR: e.cfg.LR, WeightDecay: e.cfg.WeightDecay, NoDecay: optim.NoDecayVectors,
	})
}

// weights returns a copy of e's parameters and optimizer state; ok is
// false while e does not exist yet (Config.Lazy). The caller holds e.mu.
func (e *expert) weights() (params map[string]*tensor.Tensor, st optim.State, ok bool, err error) {
	if e.cfg.Executor != nil {
		params, st, err = e.executorState()
		return params, st, params != nil, err
	}
	if e.module == nil {
		return nil, optim.State{}, false, nil
	}
	return nn.ExportParams(e.module.Params()), e.opt.State(), true, nil
}

// reset gives e its initial weights and a fresh optimizer. The caller
// holds e.mu.
func (e *expert) reset() error {
	e.pendingRows, e.pendingBatches = 0, 0
	if e.cfg.Executor != nil {
		e.built = false
		return e.build(context.Background())
	}
	e.module, e.opt = nil, nil
	e.materialize()
	return nil
}

// Expert types.
const (
	TypeFFN         = "ffn"
	TypeTransformer = "transformer"
)

// ExpertParams is the number of parameters of one expert of the given type
// and hidden size, as BuildExpert builds it (without building it): 8h²+7h
// for an FFN expert, 12h²+13h for a transformer layer. A hosted expert
// keeps four float32s per parameter (weight, gradient, two AdamW moments).
func ExpertParams(typ string, hidden int) int64 {
	h := int64(hidden)
	if typ == TypeTransformer {
		return 12*h*h + 13*h
	}
	return 8*h*h + 7*h
}

// BuildExpert returns a fresh expert module of the given type: Learning@home's
// FFN block x + FFN(LN(x)) (inner size 4·hidden) or a BERT encoder layer with
// the given number of heads (no dropout, so the forward pass is
// deterministic and a backward call can recompute it).
func BuildExpert(typ string, hidden, heads int, rng *rand.Rand) nn.Module {
	if typ == TypeTransformer {
		return nn.NewEncoderLayer(hidden, heads, 4*hidden, 0, rng)
	}
	return nn.NewExpert(hidden, rng)
}

// forward runs a batch. The caller holds e.mu.
func (e *expert) forward(x *tensor.Tensor) *tensor.Tensor {
	e.materialize()
	y, _ := e.module.Forward(nn.Ctx{}, x)
	return y
}

// backward recomputes the forward pass on x, backpropagates dy and returns
// the gradient with respect to x. The parameter gradients accumulate until
// they cover Config.StepRows rows; then their mean is checked, clipped and
// applied in one optimizer step. A step whose gradients are not finite is
// skipped: the accumulated gradients are dropped and the weights stay as
// they were (a request cannot make them NaN). It reports whether a step
// was taken, clipped or skipped. The caller holds e.mu.
func (e *expert) backward(x, dy *tensor.Tensor) (*tensor.Tensor, outcome) {
	e.materialize()
	if e.pendingBatches == 0 {
		e.opt.ZeroGrad()
	}
	_, st := e.module.Forward(nn.Ctx{Train: true}, x)
	dx := e.module.Backward(st, dy)
	e.pendingBatches++
	e.pendingRows += x.Shape[0]
	if e.pendingRows < e.cfg.StepRows {
		return dx, outcome{}
	}
	params := e.opt.Params()
	if e.pendingBatches > 1 {
		for _, p := range params {
			tensor.Scale(1/float32(e.pendingBatches), p.Grad.Data)
		}
	}
	e.pendingRows, e.pendingBatches = 0, 0
	// The norm is accumulated in float64, so it is finite exactly when
	// every gradient is; ClipGradNorm leaves non-finite gradients alone.
	norm := optim.ClipGradNorm(params, e.clipNorm())
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return dx, outcome{skipped: true, norm: norm}
	}
	e.opt.Step()
	return dx, outcome{stepped: true, clipped: norm > e.clipNorm(), norm: norm}
}

// outcome is what a backward batch did to the expert's weights.
type outcome struct {
	stepped, clipped, skipped bool
	// norm is the gradient norm of the step, taken or skipped.
	norm float64
}

// clipNorm is the norm optim.ClipGradNorm clips to (+Inf: never).
func (e *expert) clipNorm() float64 {
	if e.cfg.ClipNorm <= 0 {
		return math.Inf(1)
	}
	return e.cfg.ClipNorm
}

// record adds one processed batch to the statistics.
// It returns the number of skipped steps so far.
func (e *expert) record(backward bool, o outcome, tasks, rows int, latency, run time.Duration) int64 {
	e.statsMu.Lock()
	defer e.statsMu.Unlock()
	s := &e.stats
	if backward {
		s.Backward.add(tasks, rows, latency, run)
		if o.stepped {
			s.Updates++
		}
		if o.clipped {
			s.ClippedSteps++
		}
		if o.skipped {
			s.SkippedSteps++
		}
	} else {
		s.Forward.add(tasks, rows, latency, run)
	}
	return s.SkippedSteps
}

func (e *expert) recordError(backward bool) {
	e.statsMu.Lock()
	defer e.statsMu.Unlock()
	if backward {
		e.stats.Backward.Errors++
	} else {
		e.stats.Forward.Errors++
	}
}

func (e *expert) snapshotStats() ExpertStats {
	e.statsMu.Lock()
	defer e.statsMu.Unlock()
	return e.stats
}

// ExpertStats are one expert's counters since the server started.
type ExpertStats struct {
	UID      string    `json:"uid"`
	Forward  CallStats `json:"forward"`
	Backward CallStats `json:"backward"`
	// Updates counts optimizer steps (one per backward batch unless
	// Config.StepRows accumulates several).
	Updates int64 `json:"updates"`
	// ClippedSteps counts the updates whose gradient norm was clipped to
	// Config.ClipNorm.
	ClippedSteps int64 `json:"clipped_steps"`
	// SkippedSteps counts the steps skipped because their gradients were
	// not finite (the weights were left as they were).
	SkippedSteps int64 `json:"skipped_steps"`
	// Rollbacks counts the times a checkpoint found the expert's weights
	// or optimizer state not finite and restored its last good state.
	Rollbacks int64 `json:"rollbacks"`
}

// CallStats count one kind of call of one expert.
type CallStats struct {
	// Requests is the number of requests answered, Errors those that failed.
	Requests int64 `json:"requests"`
	Errors   int64 `json:"errors"`
	// Batches and Rows count processed batches and the samples in them.
	Batches int64 `json:"batches"`
	Rows    int64 `json:"rows"`
	// MaxBatch is the largest batch in rows.
	MaxBatch int `json:"max_batch"`
	// LatencySeconds sums, over requests, the time from arrival to answer
	// (queueing plus compute); RunSeconds sums the compute time of batches.
	LatencySeconds float64 `json:"latency_seconds"`
	RunSeconds     float64 `json:"run_seconds"`
}

func (c *CallStats) add(tasks, rows int, latency, run time.Duration) {
	c.Requests += int64(tasks)
	c.Batches++
	c.Rows += int64(rows)
	c.MaxBatch = max(c.MaxBatch, rows)
	c.LatencySeconds += latency.Seconds()
	c.RunSeconds += run.Seconds()
}

// MeanBatch is the average batch size in rows.
func (c CallStats) MeanBatch() float64 {
	if c.Batches == 0 {
		return 0
	}
	return float64(c.Rows) / float64(c.Batches)
}

// MeanLatency is the average time from a request's arrival to its answer.
func (c CallStats) MeanLatency() time.Duration {
	if c.Requests == 0 {
		return 0
	}
	return time.Duration(c.LatencySeconds / float64(c.Requests) * float64(time.Second))
}
