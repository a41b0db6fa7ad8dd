// WA-DiLoCo (wait-avoiding DiLoCo): DiLoCo's outer optimizer for the
// global outer steps every Tau outer steps, and WAGMA's butterfly groups
// mixing the replicas between them (see diloco.go).

package optimizer

import (
	"context"
	"fmt"
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/tensor"
)

// waDiLoCo is WA-DiLoCo. Every H inner steps the first member of this
// round's butterfly group to arrive starts the group's average of the
// pseudo-gradients in the background, applied at a later Step as a plain
// average (outerGroupLocked); every Tau outer steps a global outer step
// with every live peer (in the background, startGlobal; synchronously
// with τ = 1 and in the warm-up, globalOuter) takes DiLoCo's outer step
// on everything since the previous one.
type waDiLoCo struct {
	*outer
	tau int

	// Under Optimizer.mu.
	// base is the anchor after the last global outer step: every peer's
	// is the same, so anchor − base is small and compresses well. The
	// anchor moves with the group averages; base and the momentum only
	// with global outer steps.
	base []float32
	// group is closed when this peer's last group outer step ends; nil
	// while none runs. Group outer steps run one after the other, and the
	// background global steps (globalRun) too.
	group     chan struct{}
	globalRun chan struct{}
	// queued counts group outer steps waiting for the previous one to
	// end: while one waits, startGroup declines more (a member that joins
	// two steps late keeps its group waiting, and delays spread).
	queued int
}

func newWADiLoCo(o *Optimizer) (algorithm, error) {
	d, err := newOuter(o, waStateVectors)
	if err != nil {
		return nil, err
	}
	return &waDiLoCo{outer: d, tau: o.cfg.Tau, base: append([]float32(nil), d.anchor...)}, nil
}

// buffers returns the anchor, the momentum and the base (views).
func (w *waDiLoCo) buffers() map[string]*tensor.Tensor {
	b := w.outer.buffers()
	b[outerBase] = tensor.FromSlice(w.base, len(w.base))
	return b
}

// step takes an inner step, then, after H of them, the outer step:
// synchronous with all peers with τ = 1 and in the warm-up, otherwise
// this round's group or, every Tau outer steps, the global one, in the
// background. round is the outer step counter before this Step.
func (w *waDiLoCo) step(ctx context.Context, samples, round int) error {
	o, r := w.o, w.o.ranks
	w.innerStep(samples)
	w.local++
	next := round + 1
	if w.tau == 1 {
		// With τ = 1 every outer step is global and synchronous, as
		// DiLoCo's: this peer finishes its H inner steps first, so that
		// WA-DiLoCo is then DiLoCo, unless it is a whole outer step
		// behind an announced one (k > next), which it joins now.
		if k := int(r.global.Load()); k > r.lastGlobal && k > next {
			return w.globalOuter(ctx, k)
		}
	}
	if w.local < w.innerSteps(round) {
		return nil
	}
	if w.tau == 1 || w.warming(round) {
		return w.globalOuter(ctx, next)
	}
	w.local = 0
	o.mu.Lock()
	if next > o.round {
		o.round, o.stats.Round = next, next
	}
	o.mu.Unlock()
	if next%w.tau == 0 {
		w.startGlobal(next, true)
	} else {
		r.startGroup(next, true)
	}
	return nil
}

// busyLocked reports whether a group outer step waits to begin.
func (w *waDiLoCo) busyLocked() bool { return w.queued > 0 }

// groupWorkLocked is outerGroupLocked.
func (w *waDiLoCo) groupWorkLocked() func(context.Context, averaging.Session) {
	return w.outerGroupLocked()
}

// joinGlobal joins another peer's global outer step in the background
// (τ > 1); with τ = 1 the next Step joins it.
func (w *waDiLoCo) joinGlobal(round int) bool {
	if w.tau <= 1 {
		return false
	}
	w.startGlobal(round, false)
	return true
}

// globalOuter takes outer step target synchronously with every live peer,
// averaging [base − θ, v]: the pseudo-gradient of everything since the
// last global step (Tau·H inner steps, with the group averages in between;
// the anchors the groups moved apart do not enter it), and the momentum,
// so that afterwards every peer holds the same model and state. Group
// averages still in flight are not waited for: their results arrive
// superseded and are dropped, and what they had applied before is part of
// θ.
func (w *waDiLoCo) globalOuter(ctx context.Context, target int) error {
	r := w.o.ranks
	if !w.warming(target - 1) {
		// τ = 1: a peer a whole outer step behind joins on receipt. The
		// warm-up's steps are not announced: every peer takes them in turn,
		// and the others would start a background global step of the same
		// session on receipt.
		r.activateAll(ctx, target)
	}
	err := w.syncOuter(ctx, target,
		func() {
			copy(w.pg[w.o.n:], w.mom)
			w.pseudoGradientLocked(w.base)
		},
		func() { w.applyGlobalLocked(w.pg) })
	r.lastGlobal = target
	return err
}

// startGlobal joins the global outer step of round k (τ > 1) in the
// background unless this peer already has; active says whether this peer
// arrived first and announces it (the others start it on receipt). Unlike
// a group round it is never declined for lack of an in-flight slot: a
// peer that missed it would keep another base.
func (w *waDiLoCo) startGlobal(round int, active bool) {
	o, r := w.o, w.o.ranks
	ms := r.alive(r.allRanks())
	if len(ms) < 2 {
		return
	}
	id := fmt.Sprintf("%s/g/%d", o.cfg.RunID, round)
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := r.joined[id]; ok || o.closed || !o.started {
		return
	}
	r.joined[id] = round
	if round > o.round {
		o.round, o.stats.Round = round, round
	}
	average := w.outerGlobalLocked()
	ctx := o.bgCtx
	o.goLocked(func() {
		if active {
			done := make(chan struct{})
			go func() {
				defer close(done)
				r.activateAll(ctx, round)
			}()
			defer func() { <-done }()
		}
		average(ctx, averaging.Session{ID: id, Members: ms})
	})
}

// outerGlobalLocked prepares the global outer step in the background
// (Optimizer.mu held) and returns the work. It waits for this peer's
// previous global step to end, then takes the model θ (with pending
// corrections: all the progress so far, whether this peer arrived first or
// joins on receipt) and all-reduces [base − θ, v] with every live peer.
// When the means arrive it takes the outer Nesterov step from base with
// them (θ_start ← base − η·(Δ̄ + μ·v'), v' = μ·v̄ + Δ̄), makes that the new
// base, and leaves the model's correction θ_start − θ_snapshot pending for
// the next Step, so the progress made meanwhile is kept, as in the group
// averages. Group results still in flight are superseded and dropped. If
// the all-reduce fails entirely without this peer stopping, the step is
// taken with this peer's own vector.
func (w *waDiLoCo) outerGlobalLocked() func(context.Context, averaging.Session) {
	o := w.o
	begin, end := w.inTurnLocked(&w.globalRun)
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
			vec[j] = w.base[j] - snap[j]
		}
		copy(vec[n:], w.mom)
		o.mu.Unlock()
		res, err := o.avg.AllReduce(ctx, s, vec)
		o.note(ctx, s.Members, res, err)
		if err != nil && ctx.Err() != nil {
			return
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		w.applyGlobalLocked(vec)
		o.stats.GlobalSyncs++
		for j := range snap {
			o.delta[j] += w.anchor[j] - snap[j]
		}
	}
}

// applyGlobalLocked takes the global outer step from base with the
// averaged [base − θ, v] and makes the result the anchor and the new base;
// group results still in flight are superseded. Optimizer.mu must be held.
func (w *waDiLoCo) applyGlobalLocked(vec []float32) {
	o, n := w.o, w.o.n
	copy(w.anchor, w.base)
	copy(w.mom, vec[n:])
	o.syncs++
	w.updateLocked(0, vec[:n])
	copy(w.base, w.anchor)
}

// outerGroupLocked prepares the group average (Optimizer.mu held) and
// returns the work ranks.startGroup runs in the background.
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
func (w *waDiLoCo) outerGroupLocked() func(context.Context, averaging.Session) {
	o := w.o
	begin, end := w.inTurnLocked(&w.group)
	w.queued++
	return func(ctx context.Context, s averaging.Session) {
		defer end()
		ok := begin(ctx)
		o.mu.Lock()
		w.queued--
		o.mu.Unlock()
		if !ok {
			return
		}
		o.mu.Lock()
		snap := o.snapshotLocked()
		pg := make([]float32, o.n)
		for j := range pg {
			pg[j] = w.anchor[j] - snap[j]
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
			w.anchor[j] -= g
			o.delta[j] += w.anchor[j] - snap[j]
		}
		o.stats.OuterSteps++
	}
}

// inTurnLocked makes background works that use slot run one after the
// other (Optimizer.mu held): it installs this work as slot's latest and
// returns its prologue and epilogue. begin waits for the previous work to
// end and reports false if ctx ends first; end, deferred by the work,
// clears slot unless a later work took it and lets the next one begin.
func (w *waDiLoCo) inTurnLocked(slot *chan struct{}) (begin func(context.Context) bool, end func()) {
	o := w.o
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
