package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/wire"
)

// Plan returns the running plan; device indices refer to Cluster's
// devices.
func (s *Session) Plan() alloc.Plan {
	_, idx := s.cluster()
	pos := map[int]int{}
	for d, w := range idx {
		pos[w] = d
	}
	p := alloc.Plan{}
	for _, a := range s.stages {
		p.Stages = append(p.Stages, alloc.Stage{Device: pos[a.worker], First: a.first, Last: a.last})
	}
	return p
}

// Problem returns the allocation problem of the live workers with their
// current speeds and the measured link, for comparing plans.
func (s *Session) Problem() alloc.Problem {
	cl, _ := s.cluster()
	return alloc.Problem{Cluster: cl, Model: s.amodel}
}

// cluster describes the live workers (in registration order) and returns
// their coordinator indices. Devices carry their workers' regions and the
// links are the measured ones.
func (s *Session) cluster() (*alloc.Cluster, []int) {
	cl := &alloc.Cluster{}
	for pair, l := range s.links {
		cl.RegionLinks = append(cl.RegionLinks, alloc.RegionLink{A: pair[0], B: pair[1], Link: l})
	}
	slices.SortFunc(cl.RegionLinks, func(a, b alloc.RegionLink) int {
		if c := cmp.Compare(a.A, b.A); c != 0 {
			return c
		}
		return cmp.Compare(a.B, b.B)
	})
	var idx []int
	for _, w := range s.c.Workers() {
		if !w.Alive || !(w.Speed > 0) {
			continue
		}
		mem := w.MemCap
		if mem <= 0 {
			mem = 1 << 50
		}
		cl.Devices = append(cl.Devices, alloc.Device{Name: w.Name, Speed: w.Speed, MemBytes: mem, Region: regionOf(w)})
		idx = append(idx, w.Index)
	}
	// Pairs nobody measured (a region that joined later) fall back to the
	// slowest measured link.
	for _, l := range s.links {
		if l.Latency > cl.Inter.Latency {
			cl.Inter.Latency = l.Latency
		}
		if cl.Inter.Bandwidth == 0 || (l.Bandwidth > 0 && l.Bandwidth < cl.Inter.Bandwidth) {
			cl.Inter.Bandwidth = l.Bandwidth
		}
	}
	cl.Intra = cl.Inter
	return cl, idx
}

// regionOf is a worker's region, "local" if it did not name one.
func regionOf(w WorkerInfo) string {
	if w.Region == "" {
		return "local"
	}
	return w.Region
}

// regionPair is the sorted key of the link between two regions.
func regionPair(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

// choosePlan solves the allocation problem of the live workers with the
// strategy, or validates a given plan, and returns it with worker indices
// in Device.
func (s *Session) choosePlan(ctx context.Context, strategy string, fixed *alloc.Plan) (alloc.Plan, error) {
	cl, idx := s.cluster()
	if len(idx) == 0 {
		return alloc.Plan{}, errors.New("pipeline: no live worker to plan for")
	}
	var plan alloc.Plan
	if fixed != nil {
		if err := fixed.Validate(len(cl.Devices), len(s.amodel.Layers)); err != nil {
			return alloc.Plan{}, fmt.Errorf("pipeline: plan: %w", err)
		}
		plan = alloc.Plan{Stages: slices.Clone(fixed.Stages)}
	} else {
		var err error
		if plan, err = s.Solve(ctx, strategy); err != nil {
			return alloc.Plan{}, err
		}
	}
	if rep, err := alloc.Evaluate(cl, s.amodel, plan); err == nil {
		fmt.Fprintf(s.cfg.Log, "plan (%s): %s, predicted %.1f ms/iteration\n", strategy, describePlan(cl, plan), 1e3*rep.Iteration)
	}
	for i := range plan.Stages {
		plan.Stages[i].Device = idx[plan.Stages[i].Device]
	}
	return plan, nil
}

func describePlan(cl *alloc.Cluster, p alloc.Plan) string {
	out := ""
	for i, st := range p.Stages {
		if i > 0 {
			out += " | "
		}
		out += fmt.Sprintf("%s[%d,%d)", cl.Devices[st.Device].Name, st.First, st.Last)
	}
	return out
}

// Solve plans the live workers (device indices as in Problem) with an
// alloc strategy. For "skyhive", the network-aware strategy, it also
// solves on the workers of each region alone and keeps the plan whose
// simulated iteration (Predict) is the fastest: alloc's cost model does
// not see the coordinator, which sends the batch to the first stage and
// runs the commit round trip with every stage, so a plan entirely in a
// region far from the coordinator can lose to one near it.
func (s *Session) Solve(ctx context.Context, strategy string) (alloc.Plan, error) {
	pr := s.Problem()
	res, err := alloc.Solve(ctx, strategy, pr)
	if err != nil {
		return alloc.Plan{}, fmt.Errorf("pipeline: plan with %s: %w", strategy, err)
	}
	best := res.Plan
	if strategy != "skyhive" || s.cm == nil || len(pr.Cluster.Regions()) < 2 {
		return best, nil
	}
	bestP, err := s.Predict(best)
	if err != nil {
		return best, nil
	}
	for _, r := range pr.Cluster.Regions() {
		sub := *pr.Cluster
		sub.Devices = nil
		var idx []int
		for i, d := range pr.Cluster.Devices {
			if d.Region == r {
				sub.Devices = append(sub.Devices, d)
				idx = append(idx, i)
			}
		}
		rr, err := alloc.Solve(ctx, strategy, alloc.Problem{Cluster: &sub, Model: pr.Model})
		if err != nil {
			continue // e.g. the region lacks memory
		}
		cand := alloc.Plan{Stages: slices.Clone(rr.Plan.Stages)}
		for k := range cand.Stages {
			cand.Stages[k].Device = idx[cand.Stages[k].Device]
		}
		if p, err := s.Predict(cand); err == nil && p.Iteration < bestP.Iteration {
			best, bestP = cand, p
		}
	}
	return best, nil
}

// Report returns the alloc cost model's report of a plan (device indices
// as in Problem), with the calibrated layer costs.
func (s *Session) Report(p alloc.Plan) (*alloc.Report, error) {
	pr := s.Problem()
	return alloc.Evaluate(pr.Cluster, pr.Model, p)
}

// Predict simulates one iteration of a plan (device indices as in
// Problem) under the session's schedule with the calibrated costs, the
// workers' speeds and the measured links (see costModel.simulate).
func (s *Session) Predict(p alloc.Plan) (Prediction, error) {
	cl, _ := s.cluster()
	if s.cm == nil {
		return Prediction{}, errors.New("pipeline: no profile to predict from")
	}
	if err := p.Validate(len(cl.Devices), len(s.base.Layers)); err != nil {
		return Prediction{}, fmt.Errorf("pipeline: plan: %w", err)
	}
	return s.cm.simulate(s.simStages(cl, p), s.cfg.Schedule, s.microSizes(s.cfg.Batch)), nil
}

// simStages is the simulator's view of a valid plan on cl.
func (s *Session) simStages(cl *alloc.Cluster, p alloc.Plan) []simStage {
	stages := make([]simStage, len(p.Stages))
	for k, st := range p.Stages {
		d := cl.Devices[st.Device]
		stages[k] = simStage{first: st.First, last: st.Last, factor: s.cm.factor(d.Speed), coord: s.coordLinks[d.Region]}
		if k+1 < len(p.Stages) {
			stages[k].next = cl.Link(st.Device, p.Stages[k+1].Device)
		}
	}
	return stages
}

// microSizes splits n examples into the schedule's micro-batches.
func (s *Session) microSizes(n int) []int {
	m := s.cfg.Schedule.Micro(s.cfg.Micro)
	sizes := make([]int, m)
	for i := range sizes {
		sizes[i] = n/m + btoi(i < n%m)
	}
	return sizes
}

// SetPlan moves the layers to a new plan (device indices as in Problem),
// carrying the current weights and optimizer state over.
func (s *Session) SetPlan(ctx context.Context, p alloc.Plan) error {
	plan, err := s.choosePlan(ctx, "given", &p)
	if err != nil {
		return err
	}
	snap, err := s.gather(ctx)
	if err != nil {
		return err
	}
	return s.apply(ctx, plan, snap)
}

// apply installs plan (worker indices in Device) with state from snap and
// releases the workers it leaves out.
func (s *Session) apply(ctx context.Context, plan alloc.Plan, snap Snapshot) error {
	s.gen++
	stages := make([]assignment, len(plan.Stages))
	planned := make([]float64, len(plan.Stages))
	used := map[int]bool{}
	for k, st := range plan.Stages {
		planned[k] = s.c.worker(st.Device).speed(s.c)
		stages[k] = assignment{worker: st.Device, first: st.First, last: st.Last}
		used[st.Device] = true
	}
	errs := make([]error, len(stages))
	var wg sync.WaitGroup
	for k, a := range stages {
		req := setupReq{
			Gen: s.gen, Stage: k, Stages: len(stages), First: a.first, Last: a.last,
			Model: s.cfg.Model, Seed: s.cfg.Seed, Batch: s.cfg.Batch, Optim: s.cfg.Optim,
			Step: snap.Step, Iter: s.iter,
		}
		var err error
		if k > 0 {
			if req.Prev, err = s.c.routeRef(a.worker, stages[k-1].worker); err != nil {
				return err
			}
		}
		if k+1 < len(stages) {
			if req.Next, err = s.c.routeRef(a.worker, stages[k+1].worker); err != nil {
				return err
			}
		}
		req.Pin = s.c.routes.pinned()
		part, err := snap.forParams(s.ref.Slice(a.first, a.last).Params())
		if err != nil {
			return err
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			_, errs[k] = s.c.call(cctx, a.worker, ProtoSetup, req, mapNamed(part.tensors()), nil, wire.Limits{})
		})
	}
	for _, w := range s.c.Workers() {
		if !w.Alive || used[w.Index] {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			s.c.call(cctx, w.Index, ProtoSetup, setupReq{Gen: s.gen, Stage: -1}, nil, nil, wire.Limits{})
		})
	}
	wg.Wait()
	s.stages = stages
	s.drift = newDriftDetector(s.cfg.ReplanThreshold, s.cfg.ReplanPatience, planned)
	for k, err := range errs {
		if err != nil {
			return &stageError{worker: stages[k].worker, err: fmt.Errorf("pipeline: setting up stage %d: %w", k, err)}
		}
	}
	if s.c.m != nil {
		s.c.m.plan(s.gen, len(stages))
	}
	return nil
}
