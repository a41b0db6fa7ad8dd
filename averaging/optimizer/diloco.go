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
// is WAGMA's group model average). See outerGroupLocked and globalOuter.

package optimizer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
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

// ErrConfig wraps the errors New returns for a configuration it refuses.
var ErrConfig = errors.New("averaging: bad configuration")

// Names of the outer buffers in the state served to joiners (Layout):
// a prefix no parameter-derived optimizer buffer name carries.
const (
	outerPrefix    = "diloco/"
	outerAnchor    = outerPrefix + "anchor"
	outerMomentum  = outerPrefix + "momentum"
	outerBase      = outerPrefix + "base" // WA-DiLoCo only
	waStateVectors = 2                    // base − θ, v
)

// outer is the state of DiLoCo's outer optimization.
type outer struct {
	h, h0  int // H, and the first outer step's in the warm-up (0: none)
	lr, mu float32
	wa     bool

	// Step's goroutine only.
	local int       // inner steps since the last outer step
	pg    []float32 // a synchronous outer step's vector; Δ̄ first after it

	// st is Streaming DiLoCo's schedule (Config.Fragments,
	// OverlapSteps); nil for whole-model blocking outer steps.
	st *stream

	// Under Optimizer.mu.
	anchor []float32 // θ_start
	mom    []float32 // v
	// base is WA-DiLoCo's anchor after the last global outer step: every
	// peer's is the same, so anchor − base is small and compresses well.
	// The anchor moves with the group averages; base and the momentum
	// only with global outer steps.
	base []float32
	// group is closed when this peer's last group outer step ends; nil
	// while none runs. WA-DiLoCo runs them one after the other, and its
	// background global steps (globalRun) too.
	group     chan struct{}
	globalRun chan struct{}
	// queued counts group outer steps waiting for the previous one to
	// end: while one waits, startGroup declines more (a member that joins
	// two steps late keeps its group waiting, and delays spread).
	queued int
}

// newOuter checks and completes cfg's DiLoCo fields and returns the outer
// state, anchored at the parameters' current values.
func newOuter(cfg *Config, params []*nn.Param, n int) (*outer, error) {
	switch {
	case cfg.InnerSteps < 0:
		return nil, fmt.Errorf("%w: %d inner steps, want at least 1 (0: %d)", ErrConfig, cfg.InnerSteps, DefaultInnerSteps)
	case cfg.InnerSteps == 0:
		cfg.InnerSteps = DefaultInnerSteps
	}
	if cfg.WarmupInnerSteps < 0 || cfg.WarmupInnerSteps > cfg.InnerSteps {
		return nil, fmt.Errorf("%w: %d warm-up inner steps, want 0 (none) to the %d inner steps", ErrConfig, cfg.WarmupInnerSteps, cfg.InnerSteps)
	}
	switch lr := cfg.OuterLR; {
	case math.IsNaN(lr) || math.IsInf(lr, 0) || lr < 0:
		return nil, fmt.Errorf("%w: outer learning rate %v, want a finite value above 0 (0: %v)", ErrConfig, lr, DefaultOuterLR)
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
		return nil, fmt.Errorf("%w: outer momentum %v, want [0, 1) or NoMomentum (%d)", ErrConfig, mu, NoMomentum)
	}
	d := &outer{
		h: cfg.InnerSteps, h0: cfg.WarmupInnerSteps, lr: float32(cfg.OuterLR), mu: float32(mu), wa: cfg.Algo == WADiLoCo,
		anchor: make([]float32, n), mom: make([]float32, n),
	}
	nn.FlatValues(params, d.anchor)
	var err error
	if d.st, err = newStream(*cfg, n); err != nil {
		return nil, err
	}
	if d.wa {
		d.base = append([]float32(nil), d.anchor...)
		d.pg = make([]float32, waStateVectors*n)
	} else {
		d.pg = make([]float32, n)
	}
	return d, nil
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

// withState returns st with the outer buffers added (views, not copies);
// st itself for a nil d.
func (d *outer) withState(st optim.State) optim.State {
	if d == nil {
		return st
	}
	out := optim.State{Step: st.Step, Tensors: maps.Clone(st.Tensors)}
	if out.Tensors == nil {
		out.Tensors = map[string]*tensor.Tensor{}
	}
	out.Tensors[outerAnchor] = tensor.FromSlice(d.anchor, len(d.anchor))
	out.Tensors[outerMomentum] = tensor.FromSlice(d.mom, len(d.mom))
	if d.wa {
		out.Tensors[outerBase] = tensor.FromSlice(d.base, len(d.base))
	}
	return out
}

// splitOuterState separates the outer buffers from the wrapped
// optimizer's.
func splitOuterState(st optim.State) (optim.State, map[string]*tensor.Tensor) {
	outerTs := map[string]*tensor.Tensor{}
	for name, t := range st.Tensors {
		if strings.HasPrefix(name, outerPrefix) {
			outerTs[name] = t
			delete(st.Tensors, name)
		}
	}
	return st, outerTs
}

// load installs outer buffers of a loaded state (the layout checked their
// sizes); Optimizer.mu must be held.
func (d *outer) load(ts map[string]*tensor.Tensor) {
	if d == nil {
		return
	}
	copy(d.anchor, ts[outerAnchor].Data)
	copy(d.mom, ts[outerMomentum].Data)
	if d.wa {
		copy(d.base, ts[outerBase].Data)
	}
	d.local = 0
}

// stepOuter is Step for DiLoCo and WA-DiLoCo: one inner step, then, after
// H of them, the outer step (synchronous with all peers, or, for
// WA-DiLoCo outside multiples of Tau, this round's group in the
// background). round is the outer step counter before this Step.
func (o *Optimizer) stepOuter(ctx context.Context, samples, round int) error {
	d := o.dl
	o.mu.Lock()
	o.inner.Step()
	o.applyDeltaLocked()
	nn.FlatValues(o.params, o.published)
	o.stats.Steps++
	o.stats.Samples += int64(samples)
	o.progress.add(int64(samples))
	o.mu.Unlock()
	if d.st != nil {
		return o.stepStreaming(ctx)
	}
	d.local++
	next := round + 1
	if d.wa && o.cfg.Tau == 1 {
		// With τ = 1 every outer step is global and synchronous, as
		// DiLoCo's: this peer finishes its H inner steps first, so that
		// WA-DiLoCo is then DiLoCo, unless it is a whole outer step
		// behind an announced one (k > next), which it joins now.
		if k := int(o.global.Load()); k > o.lastGlobal && k > next {
			return o.globalOuter(ctx, k)
		}
	}
	if d.local < d.innerSteps(round) {
		return nil
	}
	if !d.wa || o.cfg.Tau == 1 || d.warming(round) {
		return o.globalOuter(ctx, next)
	}
	d.local = 0
	o.mu.Lock()
	if next > o.round {
		o.round, o.stats.Round = next, next
	}
	o.mu.Unlock()
	if next%o.cfg.Tau == 0 {
		o.startGlobal(next, true)
	} else {
		o.startGroup(next, true)
	}
	return nil
}

// startGlobal joins WA-DiLoCo's global outer step of round k (τ > 1) in
// the background unless this peer already has; active says whether this
// peer arrived first and announces it (the others start it on receipt,
// handleActivate). Unlike a group round it is never declined for lack of
// an in-flight slot: a peer that missed it would keep another base.
func (o *Optimizer) startGlobal(round int, active bool) {
	ms := o.alive(o.allRanks())
	if len(ms) < 2 {
		return
	}
	id := fmt.Sprintf("%s/g/%d", o.cfg.RunID, round)
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.joined[id]; ok || o.closed || !o.started {
		return
	}
	o.joined[id] = round
	if round > o.round {
		o.round, o.stats.Round = round, round
	}
	average := o.outerGlobalLocked()
	ctx := o.bgCtx
	o.goLocked(func() {
		if active {
			done := make(chan struct{})
			go func() {
				defer close(done)
				o.activateAll(ctx, round)
			}()
			defer func() { <-done }()
		}
		average(ctx, averaging.Session{ID: id, Members: ms})
	})
}

// outerGlobalLocked prepares WA-DiLoCo's global outer step in the
// background (Optimizer.mu held) and returns the work. It waits for this
// peer's previous global step to end, then takes the model θ (with pending
// corrections: all the progress so far, whether this peer arrived first or
// joins on receipt) and all-reduces [base − θ, v] with every live peer.
// When the means arrive it takes the outer Nesterov step from base with
// them (θ_start ← base − η·(Δ̄ + μ·v'), v' = μ·v̄ + Δ̄), makes that the new
// base, and leaves the model's correction θ_start − θ_snapshot pending for
// the next Step, so the progress made meanwhile is kept, as in the group
// averages. Group results still in flight are superseded and dropped. If
// the all-reduce fails entirely without this peer stopping, the step is
// taken with this peer's own vector.
func (o *Optimizer) outerGlobalLocked() func(context.Context, averaging.Session) {
	d := o.dl
	begin, end := o.inTurnLocked(&d.globalRun)
	return func(ctx context.Context, s averaging.Session) {
		defer end()
		if !begin(ctx) {
			return
		}
		n := o.n
		o.mu.Lock()
		snap := o.snapshotLocked()
		vec := make([]float32, waStateVectors*n)
		for j := range n {
			vec[j] = d.base[j] - snap[j]
		}
		copy(vec[n:], d.mom)
		o.mu.Unlock()
		res, err := o.avg.AllReduce(ctx, s, vec)
		o.note(ctx, s.Members, res, err)
		if err != nil && ctx.Err() != nil {
			return
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		o.applyGlobalLocked(vec)
		o.stats.GlobalSyncs++
		for j := range snap {
			o.delta[j] += d.anchor[j] - snap[j]
		}
	}
}

// applyGlobalLocked takes WA-DiLoCo's global outer step from base with the
// averaged [base − θ, v] and makes the result the anchor and the new base;
// group results still in flight are superseded. Optimizer.mu must be held.
func (o *Optimizer) applyGlobalLocked(vec []float32) {
	d, n := o.dl, o.n
	copy(d.anchor, d.base)
	copy(d.mom, vec[n:])
	o.syncs++
	o.outerUpdateLocked(0, vec[:n])
	copy(d.base, d.anchor)
}

// globalOuter takes outer step target synchronously with every live peer.
// DiLoCo averages the pseudo-gradients only: its anchors and momenta agree
// by construction. WA-DiLoCo averages [base − θ, v]: the pseudo-gradient
// of everything since the last global step (Tau·H inner steps, with the
// group averages in between; the anchors the groups moved apart do not
// enter it), and the momentum, so that afterwards every peer holds the
// same model and state. Its group averages still in flight are not waited
// for: their results arrive superseded and are dropped, and what they had
// applied before is part of θ. If ctx ends during the average nothing is
// applied; the progress stays in the model and enters the next outer
// step's pseudo-gradient.
func (o *Optimizer) globalOuter(ctx context.Context, target int) error {
	d := o.dl
	if d.wa && !d.warming(target-1) {
		// τ = 1: a peer a whole outer step behind joins on receipt. The
		// warm-up's steps are not announced: every peer takes them in turn,
		// and the others would start a background global step of the same
		// session on receipt.
		o.activateAll(ctx, target)
	}
	n := o.n
	o.mu.Lock()
	from := d.anchor
	if d.wa {
		from = d.base
		copy(d.pg[n:], d.mom)
	}
	for j := range n {
		d.pg[j] = from[j] - (o.published[j] + o.delta[j])
	}
	o.mu.Unlock()
	err := o.syncAverage(ctx, fmt.Sprintf("%s/g/%d", o.cfg.RunID, target), d.pg)
	d.local, o.lastGlobal = 0, target
	o.mu.Lock()
	defer o.mu.Unlock()
	o.round, o.stats.Round = target, target
	if err != nil {
		return fmt.Errorf("averaging: outer step %d: %w", target, err)
	}
	if d.wa {
		o.applyGlobalLocked(d.pg)
	} else {
		o.outerUpdateLocked(0, d.pg[:n])
	}
	nn.SetFlatValues(o.params, d.anchor)
	copy(o.published, d.anchor)
	clear(o.delta)
	return nil
}

// outerUpdateLocked takes the outer Nesterov step with the averaged
// pseudo-gradient g on the anchor's elements from lo (all of them for a
// whole-model g); Optimizer.mu must be held.
func (o *Optimizer) outerUpdateLocked(lo int, g []float32) {
	d := o.dl
	lr, mu := d.lr, d.mu
	a, v := d.anchor[lo:lo+len(g)], d.mom[lo:lo+len(g)]
	for j, gj := range g {
		if mu != 0 {
			v[j] = mu*v[j] + gj
			gj += mu * v[j]
		}
		a[j] -= lr * gj
	}
	o.stats.OuterSteps++
}

// outerGroupLocked prepares WA-DiLoCo's group average (Optimizer.mu
// held) and returns the work startGroup runs in the background.
//
// Group outer steps of one peer run one after the other: the work first
// waits for the previous one to end (its result applied), so that no
// progress is counted in two pseudo-gradients. Then it takes this peer's
// pseudo-gradient Δ = θ_start − θ, θ being the model with pending
// corrections: for the activator, the model after its H inner steps; for a
// member that joins on receipt of the activation, whatever progress it has
// made (possibly less). The group averages Δ. When the average Δ̄_G
// arrives, the anchor moves to θ_start − Δ̄_G, the group's mean model when
// the members' anchors agree (under the lock, so a state served to a
// joiner is consistent), and the model's correction θ_start' − θ_snapshot
// = Δ − Δ̄_G, exactly WAGMA's, is left pending, to be added at the next
// Step: progress made meanwhile is kept. The outer learning rate and
// momentum act only in the global outer steps, on everything since the
// previous one: momentum built from one group's averages would pull each
// replica its own way (an earlier version took Nesterov steps here, and
// its replicas drifted apart between global steps: 81.7% against 87% for
// DiLoCo in a quick geo-data-parallel run with τ = 30).
//
// A result that arrives after a global outer step (which averages every
// peer's state and resets the model) is dropped (Stats.OuterDropped): it
// was computed from the state the global step replaced, and the progress
// in its Δ was part of the global step's. If the group's all-reduce fails
// entirely without this peer stopping, the "average" is this peer's own Δ:
// the anchor moves to the model snapshot and no correction is added.
func (o *Optimizer) outerGroupLocked() func(context.Context, averaging.Session) {
	d := o.dl
	begin, end := o.inTurnLocked(&d.group)
	d.queued++
	return func(ctx context.Context, s averaging.Session) {
		defer end()
		ok := begin(ctx)
		o.mu.Lock()
		d.queued--
		o.mu.Unlock()
		if !ok {
			return
		}
		o.mu.Lock()
		snap := o.snapshotLocked()
		pg := make([]float32, o.n)
		for j := range pg {
			pg[j] = d.anchor[j] - snap[j]
		}
		syncs := o.syncs
		o.mu.Unlock()
		res, err := o.avg.AllReduce(ctx, s, pg)
		o.note(ctx, s.Members, res, err)
		if err != nil && ctx.Err() != nil {
			return
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.syncs != syncs {
			o.stats.OuterDropped++
			return
		}
		for j, g := range pg {
			d.anchor[j] -= g
			o.delta[j] += d.anchor[j] - snap[j]
		}
		o.stats.OuterSteps++
	}
}

// inTurnLocked makes background works that use slot run one after the
// other (Optimizer.mu held): it installs this work as slot's latest and
// returns its prologue and epilogue. begin waits for the previous work to
// end and reports false if ctx ends first; end, deferred by the work,
// clears slot unless a later work took it and lets the next one begin.
func (o *Optimizer) inTurnLocked(slot *chan struct{}) (begin func(context.Context) bool, end func()) {
	prev := *slot
	done := make(chan struct{})
	*slot = done
	begin = func(ctx context.Context) bool {
		if prev == nil {
			return true
		}
		t0 := time.Now()
		defer func() {
			o.mu.Lock()
			o.stats.QueueSeconds += time.Since(t0).Seconds()
			o.mu.Unlock()
		}()
		select {
		case <-prev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	end = func() {
		o.mu.Lock()
		if *slot == done {
			*slot = nil
		}
		o.mu.Unlock()
		close(done)
	}
	return begin, end
}
