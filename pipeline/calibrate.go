package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/stats"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// profile measures every live worker that has no speed yet. The first
// one (the reference) runs alone: it also times the layers without
// slowdown at the micro-batch sizes of the sequential and pipelined
// schedules, and the optimizer step; these calibrate the cost model. The
// others then measure their speed at the same time, as they will run in
// the pipeline, so the delay with which a sleeping worker's ops end on a
// loaded machine (the per-op overhead of the cost model, the median over
// all of them) is measured under that load.
func (s *Session) profile(ctx context.Context) error {
	mb := (s.cfg.Batch + s.cfg.Micro - 1) / max(s.cfg.Micro, 1)
	n := 0
	var todo []WorkerInfo
	for _, w := range s.c.Workers() {
		switch {
		case !w.Alive:
		case w.Speed > 0:
			n++
		default:
			todo = append(todo, w)
		}
	}
	one := func(w WorkerInfo, calibrate bool) (profileReq, profileResp, bool) {
		req := profileReq{Model: s.cfg.Model, Seed: s.cfg.Seed, Batch: mb, Reps: s.cfg.ProfileReps}
		if calibrate {
			req.Calibrate = []int{mb}
			if s.cfg.Batch != mb {
				req.Calibrate = append(req.Calibrate, s.cfg.Batch)
			}
			req.Optim = s.cfg.Optim
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		var resp profileResp
		_, err := s.c.call(cctx, w.Index, ProtoProfile, req, nil, &resp, wire.Limits{})
		if err != nil || !(resp.FLOPS > 0) || math.IsInf(resp.FLOPS, 0) || !(resp.Overshoot >= 0) {
			if ctx.Err() == nil {
				fmt.Fprintf(s.cfg.Log, "profiling %s failed: %v\n", w.Name, err)
				s.c.markDead(w.Index)
			}
			return req, resp, false
		}
		return req, resp, true
	}
	var overs []float64
	done := func(w WorkerInfo, resp profileResp) {
		s.c.setSpeed(w.Index, resp.FLOPS)
		overs = append(overs, resp.Overshoot)
		fmt.Fprintf(s.cfg.Log, "worker %-8s slowdown %5.2f  region %-8s %6.2f GFLOP/s  (emulated %.1f ms for %.1f ms busy at batch %d, %.2f ms late)\n",
			w.Name, w.Slowdown, regionOf(w), resp.FLOPS/1e9, 1e3*resp.Seconds, 1e3*resp.CPU, mb, 1e3*resp.Overshoot)
		n++
	}
	fresh := s.cm == nil
	for s.cm == nil && len(todo) > 0 {
		w := todo[0]
		todo = todo[1:]
		req, resp, ok := one(w, true)
		if !ok {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		if err := s.calibrate(req, resp); err != nil {
			return err
		}
		done(w, resp)
	}
	resps := make([]profileResp, len(todo))
	oks := make([]bool, len(todo))
	var wg sync.WaitGroup
	for i, w := range todo {
		wg.Go(func() { _, resps[i], oks[i] = one(w, false) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, w := range todo {
		if oks[i] {
			done(w, resps[i])
		}
	}
	if fresh && s.cm != nil && len(overs) > 0 {
		s.cm.opOverhead = stats.Median(overs)
	}
	if n == 0 {
		return errors.New("pipeline: no live worker")
	}
	return nil
}

// calibrate builds the cost model from the reference worker's profile.
func (s *Session) calibrate(req profileReq, r profileResp) error {
	L := len(s.base.Layers)
	if len(r.Fwd) != len(req.Calibrate) || len(r.Bwd) != len(req.Calibrate) {
		return fmt.Errorf("pipeline: profile has %d calibrations, asked %d", len(r.Fwd), len(req.Calibrate))
	}
	cm := &costModel{profBatch: req.Batch, fwd: map[int][]float64{}, bwd: map[int][]float64{}, optimPerParam: r.OptimPerParam, opOverhead: r.Overshoot}
	for i, n := range req.Calibrate {
		if len(r.Fwd[i]) != L || len(r.Bwd[i]) != L {
			return fmt.Errorf("pipeline: profile has %d layer times for %d layers", len(r.Fwd[i]), L)
		}
		for l := range L {
			if !(r.Fwd[i][l] >= 0) || !(r.Bwd[i][l] >= 0) || math.IsInf(r.Fwd[i][l]+r.Bwd[i][l], 0) {
				return fmt.Errorf("pipeline: bad layer time in profile")
			}
		}
		cm.fwd[n], cm.bwd[n] = r.Fwd[i], r.Bwd[i]
	}
	f, b := cm.layerTimes(req.Batch)
	for l := range L {
		cm.refTotal += f[l] + b[l]
	}
	if !(cm.refTotal > 0) {
		return errors.New("pipeline: profile measured no time")
	}
	cm.inFloats = s.info.InputLen()
	cm.modelFLOPs = s.ref.Cost(append([]int{req.Batch}, s.info.Input...)).TotalFLOPs()
	for _, c := range s.ref.LayerCosts(append([]int{1}, s.info.Input...)) {
		cm.params = append(cm.params, c.Params)
		cm.outFloats = append(cm.outFloats, int64(tensor.NumElements(c.OutShape)))
	}
	s.cm = cm
	s.amodel = cm.allocModel(s.base, s.cfg.Batch, s.cfg.Schedule.Micro(s.cfg.Micro))
	return nil
}

// measureLinks measures the links the plan may use: from the coordinator
// to one worker of every region (its round trips), and between every pair
// of regions, including a region with itself, by asking a worker of one
// to probe a worker of the other over the route it would use for
// activations. Latency is half an empty round trip; bandwidth what a
// larger request adds to it.
func (s *Session) measureLinks(ctx context.Context) error {
	byRegion := map[string][]int{}
	var regions []string
	for _, w := range s.c.Workers() {
		if !w.Alive {
			continue
		}
		r := regionOf(w)
		if byRegion[r] == nil {
			regions = append(regions, r)
		}
		byRegion[r] = append(byRegion[r], w.Index)
	}
	if len(regions) == 0 {
		return errors.New("pipeline: no live worker")
	}
	if s.links == nil {
		s.links, s.coordLinks = map[[2]string]alloc.Link{}, map[string]alloc.Link{}
	}
	for _, r := range regions {
		if _, ok := s.coordLinks[r]; ok {
			continue
		}
		w := byRegion[r][0]
		l, err := s.c.probe(ctx, -1, w)
		if err != nil {
			return fmt.Errorf("pipeline: measuring the link to %s: %w", s.c.worker(w).Name, err)
		}
		s.coordLinks[r] = l
		fmt.Fprintf(s.cfg.Log, "link coordinator→%s: latency %.3f ms, bandwidth %.1f MB/s\n", r, 1e3*l.Latency, l.Bandwidth/1e6)
	}
	for i, a := range regions {
		for _, b := range regions[i:] {
			if _, ok := s.links[regionPair(a, b)]; ok {
				continue
			}
			from, to := byRegion[a][0], -1
			for _, w := range byRegion[b] {
				if w != from {
					to = w
					break
				}
			}
			if to < 0 {
				continue // a region with one worker never links to itself
			}
			l, err := s.c.probe(ctx, from, to)
			if err != nil {
				return fmt.Errorf("pipeline: measuring the link %s→%s: %w", s.c.worker(from).Name, s.c.worker(to).Name, err)
			}
			s.links[regionPair(a, b)] = l
			fmt.Fprintf(s.cfg.Log, "link %s↔%s: latency %.3f ms, bandwidth %.1f MB/s\n", a, b, 1e3*l.Latency, l.Bandwidth/1e6)
		}
	}
	return nil
}

// Recalibrate corrects the cost model and the workers' planning speeds
// with what iterations of the current plan measured. A profile times the
// model alone on one worker, inside one whole-model pass; inside a running
// pipeline the same layers take longer (20–35% for 16 emulated devices
// sharing two cores), and every op of a stage pays a busy time of its own
// (decoding its input, encoding its output) that matters most on stages of
// a few light layers. So two factors are calibrated apart, from each
// stage's median busy time (StageTiming.CPU, which the emulated slowdown
// does not touch) and median compute time less the optimizer step:
//
//   - the layers' costs: the busy time every op pays (opBusy) and one
//     correction of the profiled layer times, common to all layers, both
//     fitted over the stages;
//   - the workers' factors: a stage's compute time less the wake-up
//     overheads, over the busy time the fitted costs give its layers, is
//     its worker's time per busy second, whatever layers it holds.
//
// What a stage's busy time has beyond the fitted costs belongs to its
// worker, not to its layers: the same encoder layers measured 9.5 to 14.2
// ms per layer and iteration on the eight workers of one plan, and another
// plan moved them with their workers (an emulated device that sleeps
// longer between ops finds colder caches). Correcting the layers per stage
// instead, as before, carried one worker's extra time to whichever worker
// held those layers next, and predicted the balanced plans of 8x24 12–14%
// slow.
//
// Workers without a stage are scaled by the median change of the others.
// Iterations of another plan are refused.
func (s *Session) Recalibrate(iters []IterStats) error {
	if s.cm == nil {
		return errors.New("pipeline: recalibrate: no profile")
	}
	for _, st := range iters {
		if st.Gen != s.gen || len(st.Stages) != len(s.stages) {
			return fmt.Errorf("pipeline: recalibrate: iteration %d is not of the current plan", st.Iter)
		}
	}
	return s.recalibrate(s.stages, s.Plan(), iters)
}

// RecalibrateOn calibrates as Recalibrate does on iterations of plan p
// (device indices as in Problem), which need not be the running plan: for
// example p's rounds that MeasurePlans ran between the other plans', so
// that the calibration and the measurements it predicts share the
// machine's state. Every iteration must have p's stages.
func (s *Session) RecalibrateOn(p alloc.Plan, iters []IterStats) error {
	if s.cm == nil {
		return errors.New("pipeline: recalibrate: no profile")
	}
	cl, idx := s.cluster()
	if err := p.Validate(len(cl.Devices), len(s.base.Layers)); err != nil {
		return fmt.Errorf("pipeline: recalibrate: plan: %w", err)
	}
	stages := make([]assignment, len(p.Stages))
	for k, st := range p.Stages {
		stages[k] = assignment{worker: idx[st.Device], first: st.First, last: st.Last}
	}
	for _, it := range iters {
		ok := len(it.Stages) == len(stages)
		for k := 0; ok && k < len(stages); k++ {
			t := it.Stages[k]
			ok = t.First == stages[k].first && t.Last == stages[k].last && t.Worker == s.c.worker(stages[k].worker).Name
		}
		if !ok {
			return fmt.Errorf("pipeline: recalibrate: iteration %d is not of the given plan", it.Iter)
		}
	}
	return s.recalibrate(stages, p, iters)
}

// recalibrate is Recalibrate on iterations of the plan whose stages are
// given.
func (s *Session) recalibrate(stages []assignment, plan alloc.Plan, iters []IterStats) error {
	S := len(stages)
	cpu, comp := make([][]float64, S), make([][]float64, S)
	for _, st := range iters {
		for k, t := range st.Stages {
			c := t.Compute - t.Step
			if c > 0 && t.CPU > 0 && !math.IsInf(c+t.CPU, 0) {
				cpu[k], comp[k] = append(cpu[k], t.CPU), append(comp[k], c)
			}
		}
	}
	sizes := s.microSizes(s.cfg.Batch)
	var obs []stageObs
	var stageOf []int
	for k, a := range stages {
		if len(cpu[k]) == 0 {
			continue
		}
		o := stageObs{Ops: float64(len(Ops(s.cfg.Schedule, k, S, len(sizes)))), CPU: stats.Median(cpu[k]), Compute: stats.Median(comp[k])}
		for _, n := range sizes {
			f, b := s.cm.profileTimes(n)
			for l := a.first; l < a.last; l++ {
				o.Profiled += f[l] + b[l]
			}
		}
		obs = append(obs, o)
		stageOf = append(stageOf, k)
	}
	fit, err := fitStages(obs, s.cm.opOverhead)
	if err != nil {
		return fmt.Errorf("pipeline: recalibrate: %w", err)
	}
	var ratios []float64
	staged := map[int]bool{}
	for i, k := range stageOf {
		a := stages[k]
		sp := s.cm.modelFLOPs / (fit.Factors[i] * s.cm.refTotal)
		if old := s.c.worker(a.worker).speed(s.c); old > 0 {
			ratios = append(ratios, sp/old)
		}
		s.c.setSpeed(a.worker, sp)
		staged[a.worker] = true
	}
	s.cm.scale, s.cm.opBusy = fit.Scale, fit.OpBusy
	s.amodel = s.cm.allocModel(s.base, s.cfg.Batch, s.cfg.Schedule.Micro(s.cfg.Micro))
	if len(ratios) > 0 {
		r := stats.Median(ratios)
		for _, w := range s.c.Workers() {
			if !staged[w.Index] && w.Speed > 0 {
				s.c.setSpeed(w.Index, w.Speed*r)
			}
		}
	}
	// The replay of expected op times misses what random op times cost a
	// pipeline whose stages wait for each other: the jitter is the op
	// times' variation the stages measured (StageTiming.OpCV, median).
	// It used to be fitted so that this plan's replay took its measured
	// median, but where one slow stage sets the pace (the even plan on
	// devices of unlike speeds) jitter hardly lengthens the iteration, so
	// a 1% gap fitted 58–72% and balanced plans came out 25–30% slower
	// than their expected replay, against 6–14% measured (8x24).
	var secs, cvs []float64
	for _, st := range iters {
		if st.Seconds > 0 && !math.IsInf(st.Seconds, 0) {
			secs = append(secs, st.Seconds)
		}
		for _, t := range st.Stages {
			if t.OpCV >= 0 && t.OpCV <= maxJitter {
				cvs = append(cvs, t.OpCV)
			}
		}
	}
	s.cm.jitter = 0
	if len(cvs) > 0 {
		s.cm.jitter = stats.Median(cvs)
	}
	cl, _ := s.cluster()
	measured, expected := math.NaN(), math.NaN()
	if len(secs) > 0 && plan.Validate(len(cl.Devices), len(s.base.Layers)) == nil {
		st := s.simStages(cl, plan)
		measured = stats.Median(secs)
		expected = s.cm.replay(st, s.cfg.Schedule, sizes, nil).Iteration
	}
	fmt.Fprintf(s.cfg.Log, "recalibrated: %.3f ms busy per op, layers ×%.2f of their profile (median), worker factors %s; op times vary by %.0f%% (iteration %.1f ms measured, %.1f ms with expected op times)\n",
		1e3*fit.OpBusy, fit.Scale, fmtFloats(fit.Factors), 100*s.cm.jitter, 1e3*measured, 1e3*expected)
	return nil
}

// stageObs is what iterations measured of one stage, per iteration: its
// ops, the profiled busy time of its layers (reference seconds), and the
// medians of its busy and compute (forward+backward) times.
type stageObs struct {
	Ops, Profiled, CPU, Compute float64
}

// stageFit is the cost model fitted to stage observations.
type stageFit struct {
	// OpBusy is the busy time every op pays beyond its layers'.
	OpBusy float64
	// Scale is the correction of the profiled layer times (the weighted
	// fit's slope).
	Scale float64
	// Factors[i] is stage i's worker's emulated seconds per busy second of
	// the fitted costs (Scale·Profiled + OpBusy·Ops).
	Factors []float64
}

// fitStages splits the stages' busy times into a busy time per op, common
// to all stages, and a correction of the profiled layer times, and derives
// each stage's device factor from its compute time and the busy time the
// fit gives its layers (its own busy time where the fit gives none).
// The per-op time comes from a least-squares fit of CPU = a·Profiled +
// OpBusy·Ops weighted by relative error (so stages of light layers, where
// it shows, count as much as heavy ones), bounded to [0, the smallest
// stage's busy time per op]. overhead is the wake-up delay every op's end
// pays (costModel.opOverhead), not part of the device's factor.
func fitStages(obs []stageObs, overhead float64) (stageFit, error) {
	if len(obs) == 0 {
		return stageFit{}, errors.New("no stage measured")
	}
	hi := math.Inf(1)
	var spp, spo, soo, scp, sco float64
	for _, o := range obs {
		if !(o.Ops > 0) || !(o.CPU > 0) || !(o.Profiled >= 0) || !(o.Compute > 0) {
			return stageFit{}, fmt.Errorf("bad stage measurement %+v", o)
		}
		hi = min(hi, o.CPU/o.Ops)
		w := 1 / (o.CPU * o.CPU)
		spp += w * o.Profiled * o.Profiled
		spo += w * o.Profiled * o.Ops
		soo += w * o.Ops * o.Ops
		scp += w * o.CPU * o.Profiled
		sco += w * o.CPU * o.Ops
	}
	fit := stageFit{}
	if det := spp*soo - spo*spo; len(obs) >= 2 && det > 1e-12*spp*soo {
		fit.OpBusy = (spp*sco - spo*scp) / det
	}
	fit.OpBusy = min(max(fit.OpBusy, 0), hi)
	// With OpBusy fixed, the slope is the weighted fit of what is left.
	var num float64
	for _, o := range obs {
		w := 1 / (o.CPU * o.CPU)
		num += w * (o.CPU - fit.OpBusy*o.Ops) * o.Profiled
	}
	if spp > 0 {
		fit.Scale = num / spp
	}
	if !(fit.Scale > 0) {
		fit.Scale = 1
	}
	for _, o := range obs {
		busy := fit.Scale*o.Profiled + fit.OpBusy*o.Ops
		if !(busy > 0) {
			busy = o.CPU
		}
		f := (o.Compute - overhead*o.Ops) / busy
		if !(f >= 1) {
			f = max(o.Compute/busy, 1)
		}
		fit.Factors = append(fit.Factors, f)
	}
	return fit, nil
}

// fmtFloats formats factors for a log line.
func fmtFloats(v []float64) string {
	var b strings.Builder
	for i, x := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%.2f", x)
	}
	return b.String()
}
