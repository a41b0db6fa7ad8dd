// Streaming DiLoCo: DiLoCo's outer steps taken one parameter fragment at
// a time, each fragment's all-reduce overlapping the next inner steps.
//
// With Config.Fragments = F > 1 the flattened parameters (layers in
// order) are cut into F contiguous slices of nearly equal size.
// Fragment p is synchronized at the inner steps t with t mod H = p·H/F
// (integer division), so the fragments take turns and at most one
// fragment's bytes are on the network at a time: fragment 0 after H,
// 2H, … steps, fragment 1 after H/F, H/F + H, …, and so on. At its step
// a fragment's pseudo-gradient Δ_p = θ_start,p − θ_p is all-reduced with
// every live peer. With Config.OverlapSteps = O > 0 the all-reduce runs
// in the background while the peer takes O more inner steps; then Step
// waits for it (if it has not ended) and takes the outer Nesterov step
// on the fragment, exactly as DiLoCo's (same η, μ, momentum buffer
// slice), and the fragment's model moves by the outer step's change to
// its snapshot, θ_p ← θ_start,p' + (θ_p − θ_p,snapshot): the O steps of
// progress made meanwhile are kept (the paper instead mixes the local
// and global fragment with a weight). With O = 0 the fragment's model is
// its new outer model, and with F = 1 as well this is DiLoCo.

package optimizer

import (
	"context"
	"fmt"
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/nn"
)

// streaming is Streaming DiLoCo: DiLoCo whose outer steps follow the
// schedule s.
type streaming struct {
	*outer
	s *stream
}

// stream is Streaming DiLoCo's schedule and its fragments in flight.
type stream struct {
	bounds  []int // fragment p is [bounds[p], bounds[p+1]) of the flat vector
	overlap int
	h       int
	// Step's goroutine only.
	step    int         // inner steps taken in the schedule
	flights []*fragSync // started, not yet applied, in start order
}

// fragSync is one fragment's outer step in flight.
type fragSync struct {
	p, due int       // fragment, and the step after which it is applied
	snap   []float32 // the fragment's model when it started
	pg     []float32 // θ_start − snap; the mean once done is closed
	done   chan struct{}
	err    error // a stopped all-reduce (ctx ended)
}

// newStream checks cfg's Fragments and OverlapSteps (DiLoCo without a
// warm-up only; New asks it for every algorithm) and returns the schedule
// for n parameters, or nil when the outer steps are whole-model and
// blocking (Fragments ≤ 1 and no overlap).
func newStream(cfg Config, n int) (*stream, error) {
	f, o := cfg.Fragments, cfg.OverlapSteps
	switch {
	case f < 0 || o < 0:
		return nil, fmt.Errorf("%w: %d fragments and %d overlap steps, want 0 or more", ErrConfig, f, o)
	case f <= 1 && o == 0:
		return nil, nil
	case cfg.Algo != DiLoCo:
		return nil, fmt.Errorf("%w: fragments and overlap steps are for diloco, not %s", ErrConfig, cfg.Algo)
	case cfg.WarmupInnerSteps > 0:
		return nil, fmt.Errorf("%w: fragments and overlap steps do not combine with a warm-up (%d warm-up inner steps)", ErrConfig, cfg.WarmupInnerSteps)
	}
	f = max(f, 1)
	if f > cfg.InnerSteps || f > n {
		return nil, fmt.Errorf("%w: %d fragments, want at most the %d inner steps (each fragment its own step) and the %d parameters", ErrConfig, f, cfg.InnerSteps, n)
	}
	if o >= cfg.InnerSteps {
		return nil, fmt.Errorf("%w: %d overlap steps, want fewer than the %d inner steps (a fragment's result is applied before its next outer step)", ErrConfig, o, cfg.InnerSteps)
	}
	s := &stream{bounds: make([]int, f+1), overlap: o, h: cfg.InnerSteps}
	for p := range f + 1 {
		s.bounds[p] = p * n / f
	}
	return s, nil
}

// due returns the fragments due after inner step t, and for each its
// outer step count (1 for its first).
func (s *stream) due(t int) (ps, ks []int) {
	f := len(s.bounds) - 1
	for p := range f {
		off := p * s.h / f
		if t%s.h == off && t > 0 {
			ps = append(ps, p)
			ks = append(ks, (t-off)/s.h+min(off, 1))
		}
	}
	return ps, ks
}

// step takes the inner step, applies the fragments whose overlap has
// passed, starts the fragments due now, and (without overlap) applies
// them at once.
func (d *streaming) step(ctx context.Context, samples, _ int) error {
	o, s := d.o, d.s
	d.innerStep(samples)
	s.step++
	if err := d.applyFragments(ctx, s.step); err != nil {
		return err
	}
	ps, ks := s.due(s.step)
	for i, p := range ps {
		d.startFragment(ctx, p, ks[i], s.step+s.overlap)
	}
	if err := d.applyFragments(ctx, s.step); err != nil {
		return err
	}
	o.mu.Lock()
	o.round, o.stats.Round = s.step/s.h, s.step/s.h
	o.mu.Unlock()
	return nil
}

// resumeLocked resumes the schedule at the start of the loaded round's
// cycle: the fragments follow the inner steps.
func (d *streaming) resumeLocked(round int) {
	d.outer.resumeLocked(round)
	d.s.step = round * d.s.h
}

// startFragment takes fragment p's pseudo-gradient and starts its k-th
// outer step's all-reduce with every live peer, to be applied after step
// due: inline (done before it returns) when there is no overlap, in the
// background otherwise.
func (d *streaming) startFragment(ctx context.Context, p, k, due int) {
	o, s := d.o, d.s
	lo, hi := s.bounds[p], s.bounds[p+1]
	fs := &fragSync{p: p, due: due, snap: make([]float32, hi-lo), pg: make([]float32, hi-lo), done: make(chan struct{})}
	o.mu.Lock()
	for j := lo; j < hi; j++ {
		fs.snap[j-lo] = o.published[j] + o.delta[j]
		fs.pg[j-lo] = d.anchor[j] - fs.snap[j-lo]
	}
	o.mu.Unlock()
	s.flights = append(s.flights, fs)
	id := fmt.Sprintf("%s/f/%d/%d", o.cfg.RunID, p, k)
	run := func(ctx context.Context) {
		defer close(fs.done)
		if ms := o.ranks.alive(o.ranks.allRanks()); len(ms) > 1 {
			res, err := o.avg.AllReduce(ctx, averaging.Session{ID: id, Members: ms}, fs.pg)
			o.note(ctx, ms, res, err)
		}
		fs.err = ctx.Err()
	}
	if s.overlap == 0 {
		run(ctx)
		return
	}
	o.mu.Lock()
	bg := o.bgCtx
	started := o.goLocked(func() { run(bg) })
	o.mu.Unlock()
	if !started {
		fs.err = ErrClosed
		close(fs.done)
	}
}

// applyFragments waits for the fragments in flight that are due by step
// t and takes their outer steps. The wait counts as waiting time; if ctx
// (or, for a background all-reduce, the optimizer) stops first, the
// fragment's progress stays in the model for its next outer step.
func (d *streaming) applyFragments(ctx context.Context, t int) error {
	o, s := d.o, d.s
	for len(s.flights) > 0 && s.flights[0].due <= t {
		fs := s.flights[0]
		select {
		case <-fs.done:
		default:
			t0 := time.Now()
			select {
			case <-fs.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			o.mu.Lock()
			o.stats.WaitSeconds += time.Since(t0).Seconds()
			o.mu.Unlock()
		}
		s.flights = s.flights[1:]
		if fs.err != nil {
			return fmt.Errorf("averaging: fragment %d's outer step: %w", fs.p, fs.err)
		}
		d.applyFragment(fs)
	}
	return nil
}

// applyFragment takes fs's outer step on its fragment and moves the
// fragment's model by the change to its snapshot, in place, so that the
// next gradients are computed at the new model.
func (d *streaming) applyFragment(fs *fragSync) {
	o := d.o
	lo := d.s.bounds[fs.p]
	o.mu.Lock()
	defer o.mu.Unlock()
	d.updateLocked(lo, fs.pg)
	for j := range fs.pg {
		o.delta[lo+j] += d.anchor[lo+j] - fs.snap[j]
	}
	o.applyDeltaLocked()
	nn.FlatValues(o.params, o.published)
	o.stats.GlobalSyncs++
}
