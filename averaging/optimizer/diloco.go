// DiLoCo and wait-avoiding DiLoCo: inner steps alone, outer steps on
// averaged pseudo-gradients.
//
// Every replica keeps θ_start (the anchor), the model at the end of the
// last outer step, and the outer momentum v. After H = InnerSteps steps of
// the wrapped optimizer, its pseudo-gradient Δ = θ_start − θ is averaged
// (through the Averager, so its codec compresses Δ, not the weights) and
// the outer step is, with η = OuterLR and μ = OuterMomentum,
//
//	v ← μ·v + Δ̄
//	θ_start ← θ_start − η·(Δ̄ + μ·v)      (Nesterov, as PyTorch's SGD)
//	θ ← θ_start
//
// v starts at zero, so the first outer step's v is Δ̄. With μ = 0 it is
// θ_start ← θ_start − η·Δ̄. The wrapped optimizer keeps its own state
// across outer steps. The round counter counts outer steps.
//
// WA-DiLoCo (wait-avoiding DiLoCo) keeps DiLoCo's outer optimizer for the
// global outer steps, every Tau outer steps, whose pseudo-gradient is
// everything since the last global one (θ_base − θ, Tau·H inner steps),
// and between them mixes the replicas in WAGMA's butterfly groups: every
// H inner steps the first arrival starts its group's average of Δ in the
// background, applied as a plain average (outer lr 1, no momentum, which
// is WAGMA's group model average). See wadiloco.go.

package optimizer

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
)

// Defaults of the DiLoCo fields of Config. The outer learning rate and
// momentum are the DiLoCo paper's; H is smaller than its 500 so that small
// swarms and short runs still take outer steps often.
const (
	DefaultInnerSteps    = 100
	DefaultOuterLR       = 0.7
	DefaultOuterMomentum = 0.9
)

// NoMomentum as Config.OuterMomentum makes the outer step plain SGD
// (μ = 0); 0 there means DefaultOuterMomentum.
const NoMomentum = -1

// Names of the outer buffers in the state served to joiners (Layout):
// a prefix no parameter-derived optimizer buffer name carries.
const (
	outerPrefix    = "diloco/"
	outerAnchor    = outerPrefix + "anchor"
	outerMomentum  = outerPrefix + "momentum"
	outerBase      = outerPrefix + "base" // WA-DiLoCo only
	waStateVectors = 2                    // base − θ, v
)

// outer is the outer optimization DiLoCo, Streaming DiLoCo and WA-DiLoCo
// share: the schedule of outer steps, the anchor and the outer momentum,
// and the outer Nesterov step.
type outer struct {
	o      *Optimizer
	h, h0  int // H, and the first outer step's in the warm-up (0: none)
	lr, mu float32

	// Step's goroutine only.
	local int       // inner steps since the last outer step
	pg    []float32 // a synchronous outer step's vector; Δ̄ first after it

	// Under Optimizer.mu.
	anchor []float32 // θ_start
	mom    []float32 // v
}

// newOuter checks and completes o's DiLoCo fields and returns the outer
// state, anchored at the parameters' current values, with a synchronous
// outer step's vector of vectors·n elements.
func newOuter(o *Optimizer, vectors int) (*outer, error) {
	mu, err := completeOuter(&o.cfg)
	if err != nil {
		return nil, err
	}
	cfg, n := o.cfg, o.n
	d := &outer{
		o: o, h: cfg.InnerSteps, h0: cfg.WarmupInnerSteps, lr: float32(cfg.OuterLR), mu: float32(mu),
		anchor: make([]float32, n), mom: make([]float32, n), pg: make([]float32, vectors*n),
	}
	nn.FlatValues(o.params, d.anchor)
	return d, nil
}

// completeOuter checks and completes cfg's DiLoCo fields and returns the
// outer momentum μ.
func completeOuter(cfg *Config) (float64, error) {
	switch {
	case cfg.InnerSteps < 0:
		return 0, fmt.Errorf("%w: %d inner steps, want at least 1 (0: %d)", ErrConfig, cfg.InnerSteps, DefaultInnerSteps)
	case cfg.InnerSteps == 0:
		cfg.InnerSteps = DefaultInnerSteps
	}
	if cfg.WarmupInnerSteps < 0 || cfg.WarmupInnerSteps > cfg.InnerSteps {
		return 0, fmt.Errorf("%w: %d warm-up inner steps, want 0 (none) to the %d inner steps", ErrConfig, cfg.WarmupInnerSteps, cfg.InnerSteps)
	}
	switch lr := cfg.OuterLR; {
	case math.IsNaN(lr) || math.IsInf(lr, 0) || lr < 0:
		return 0, fmt.Errorf("%w: outer learning rate %v, want a finite value above 0 (0: %v)", ErrConfig, lr, DefaultOuterLR)
	case lr == 0:
		cfg.OuterLR = DefaultOuterLR
	}
	mu := cfg.OuterMomentum
	switch {
	case mu == NoMomentum:
		mu = 0
	case mu == 0:
		mu = DefaultOuterMomentum
		cfg.OuterMomentum = mu
	case math.IsNaN(mu) || mu < 0 || mu >= 1:
		return 0, fmt.Errorf("%w: outer momentum %v, want [0, 1) or NoMomentum (%d)", ErrConfig, mu, NoMomentum)
	}
	return mu, nil
}

// innerSteps is the H of the outer step that follows round outer steps:
// the warm-up's first H doubled round times, up to H.
func (d *outer) innerSteps(round int) int {
	if d.h0 <= 0 {
		return d.h
	}
	h := d.h0
	for range min(round, 32) {
		if h >= d.h {
			break
		}
		h *= 2
	}
	return min(h, d.h)
}

// warming reports whether the outer step that follows round outer steps
// is one of the warm-up's (shorter than H). WA-DiLoCo takes those
// synchronously with every peer, as DiLoCo: its groups would average
// replicas that are hundreds of inner steps apart while they change
// fastest (the fast ones take up to 4× the steps of the slow ones in
// geo-data-parallel), and there the swarm's accuracy fell by about 15
// points at a global step in the first 20 s (71 to 56%, 69 to 54%).
func (d *outer) warming(round int) bool { return d.innerSteps(round) < d.h }

// buffers returns the anchor and the momentum (views).
func (d *outer) buffers() map[string]*tensor.Tensor {
	return map[string]*tensor.Tensor{
		outerAnchor:   tensor.FromSlice(d.anchor, len(d.anchor)),
		outerMomentum: tensor.FromSlice(d.mom, len(d.mom)),
	}
}

// resumeLocked starts the inner steps of a loaded state's outer step.
func (d *outer) resumeLocked(int) { d.local = 0 }

// consensusLocked returns a copy of the anchor, the outer model.
func (d *outer) consensusLocked() []float32 { return slices.Clone(d.anchor) }

func (d *outer) startLocked(context.Context) {}

// innerStep takes the wrapped optimizer's step; the round counter counts
// outer steps and stays.
func (d *outer) innerStep(samples int) {
	o := d.o
	o.mu.Lock()
	defer o.mu.Unlock()
	o.innerStepLocked(samples)
}

// pseudoGradientLocked sets pg[:n] to from − θ, θ being the model with
// pending corrections; Optimizer.mu must be held.
func (d *outer) pseudoGradientLocked(from []float32) {
	o := d.o
	for j := range o.n {
		d.pg[j] = from[j] - (o.published[j] + o.delta[j])
	}
}

// syncOuter takes outer step target synchronously with every live peer:
// fillLocked sets the vector pg that is averaged, and applyLocked takes
// the outer step with its mean (both under Optimizer.mu); the model then
// becomes the anchor. If ctx ends during the average nothing is applied;
// the progress stays in the model and enters the next outer step's
// pseudo-gradient.
func (d *outer) syncOuter(ctx context.Context, target int, fillLocked, applyLocked func()) error {
	o := d.o
	o.mu.Lock()
	fillLocked()
	o.mu.Unlock()
	err := o.syncAverage(ctx, fmt.Sprintf("%s/g/%d", o.cfg.RunID, target), d.pg)
	d.local = 0
	o.mu.Lock()
	defer o.mu.Unlock()
	o.round, o.stats.Round = target, target
	if err != nil {
		return fmt.Errorf("averaging: outer step %d: %w", target, err)
	}
	applyLocked()
	nn.SetFlatValues(o.params, d.anchor)
	copy(o.published, d.anchor)
	clear(o.delta)
	return nil
}

// updateLocked takes the outer Nesterov step with the averaged
// pseudo-gradient g on the anchor's elements from lo (all of them for a
// whole-model g); Optimizer.mu must be held.
func (d *outer) updateLocked(lo int, g []float32) {
	lr, mu := d.lr, d.mu
	a, v := d.anchor[lo:lo+len(g)], d.mom[lo:lo+len(g)]
	for j, gj := range g {
		if mu != 0 {
			v[j] = mu*v[j] + gj
			gj += mu * v[j]
		}
		a[j] -= lr * gj
	}
	d.o.stats.OuterSteps++
}

// diloco is DiLoCo: InnerSteps steps of the wrapped optimizer alone, then
// the pseudo-gradients are averaged with every live peer and the outer
// step is taken, synchronously. Its anchors and momenta agree by
// construction, so only the pseudo-gradients are averaged.
type diloco struct {
	*outer
}

// newDiLoCo returns DiLoCo, or Streaming DiLoCo when Config.Fragments or
// OverlapSteps ask for it (streaming.go).
func newDiLoCo(o *Optimizer) (algorithm, error) {
	d, err := newOuter(o, 1)
	if err != nil {
		return nil, err
	}
	st, err := newStream(o.cfg, o.n)
	if err != nil {
		return nil, err
	}
	if st != nil {
		return &streaming{outer: d, s: st}, nil
	}
	return &diloco{d}, nil
}

func (d *diloco) step(ctx context.Context, samples, round int) error {
	d.innerStep(samples)
	d.local++
	if d.local < d.innerSteps(round) {
		return nil
	}
	return d.globalOuter(ctx, round+1)
}

// globalOuter takes outer step target synchronously with every live peer.
func (d *diloco) globalOuter(ctx context.Context, target int) error {
	return d.syncOuter(ctx, target,
		func() { d.pseudoGradientLocked(d.anchor) },
		func() { d.updateLocked(0, d.pg) })
}
