package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/checkpoint"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// SessionConfig configures a pipeline training run.
type SessionConfig struct {
	// Model is a BuildModel spec; Seed seeds its initialisation.
	Model string
	Seed  uint64
	// Batch is the number of examples per iteration; Micro the number of
	// micro-batches GPipe and 1F1B split it into (Sequential uses 1).
	Batch    int
	Micro    int
	Schedule Schedule
	// Optim is every stage's optimizer; LRSchedule, if set, gives the
	// learning rate of each iteration instead of Optim.LR.
	Optim      OptimConfig
	LRSchedule *optim.Schedule
	// ClipNorm clips the global gradient norm over all stages (0: off).
	ClipNorm float64
	// Strategy names the alloc strategy for the initial plan and every
	// re-plan (default "skyhive").
	Strategy string
	// Plan, if set, is the initial plan; its device indices refer to the
	// live workers in registration order. Re-plans use Strategy.
	Plan *alloc.Plan
	// Checkpoint is the file where the coordinator snapshots all stages
	// every CheckpointEvery iterations (default 10) and from which a dead
	// worker's layers are restored. Empty: a file in a temporary
	// directory removed by Close.
	Checkpoint      string
	CheckpointEvery int
	// Resume starts from Checkpoint if it exists.
	Resume bool
	// ReplanThreshold re-plans when a stage's measured speed differs from
	// the speed it was planned with by more than this fraction (e.g. 0.3)
	// for ReplanPatience iterations in a row (default 2); 0 disables
	// drift re-planning. Failures always re-plan.
	ReplanThreshold float64
	ReplanPatience  int
	// IterTimeout bounds one iteration (default 60 s); a stage that does
	// not finish in time is treated as failed.
	IterTimeout time.Duration
	// MaxRecoveries bounds the re-plans one Step may attempt (default 3).
	MaxRecoveries int
	// ProfileReps is the number of timed runs when profiling a worker
	// (default 3).
	ProfileReps int
	// Log receives one line per event (plans, failures, re-plans); nil
	// discards them.
	Log io.Writer
}

func (c *SessionConfig) defaults() error {
	if c.Strategy == "" {
		c.Strategy = "skyhive"
	}
	if c.CheckpointEvery <= 0 {
		c.CheckpointEvery = 10
	}
	if c.ReplanPatience <= 0 {
		c.ReplanPatience = 2
	}
	if c.IterTimeout <= 0 {
		c.IterTimeout = time.Minute
	}
	if c.MaxRecoveries <= 0 {
		c.MaxRecoveries = 3
	}
	if c.ProfileReps <= 0 {
		c.ProfileReps = 3
	}
	if c.Micro <= 0 {
		c.Micro = 1
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	switch {
	case c.Batch < 1 || c.Batch > maxBatch:
		return fmt.Errorf("pipeline: batch %d out of range", c.Batch)
	case c.Schedule.Micro(c.Micro) > c.Batch || c.Micro > maxMicro:
		return fmt.Errorf("pipeline: %d micro-batches for a batch of %d", c.Micro, c.Batch)
	case c.ClipNorm < 0 || c.ReplanThreshold < 0:
		return errors.New("pipeline: negative clip norm or re-plan threshold")
	case c.Resume && c.Checkpoint == "":
		return errors.New("pipeline: resume needs a checkpoint path")
	}
	if !slices.Contains(alloc.StrategyNames(), c.Strategy) {
		return fmt.Errorf("pipeline: unknown strategy %q (want one of %v)", c.Strategy, alloc.StrategyNames())
	}
	return c.Optim.Validate()
}

// StageTiming is one stage's share of an iteration, in seconds: compute
// (forward, backward and optimizer step, including the emulated
// slowdown), communication (sending activations or gradients, which
// overlaps compute) and idle (waiting for a neighbour).
type StageTiming struct {
	Stage   int     `json:"stage"`
	Worker  string  `json:"worker"`
	First   int     `json:"first"`
	Last    int     `json:"last"`
	Compute float64 `json:"compute"`
	Comm    float64 `json:"comm"`
	Idle    float64 `json:"idle"`
	Wall    float64 `json:"wall"`
	// CPU is the CPU time of the forward and backward passes, without
	// the emulated slowdown.
	CPU float64 `json:"cpu"`
	// Speed is the measured FLOP/s of the stage's forward+backward.
	Speed float64 `json:"speed"`
}

// IterStats reports one training iteration.
type IterStats struct {
	Iter     int           `json:"iter"`
	Gen      uint64        `json:"gen"`
	Loss     float64       `json:"loss"`
	Accuracy float64       `json:"accuracy"`
	Seconds  float64       `json:"seconds"`
	Stages   []StageTiming `json:"stages"`
	// Event notes a re-plan that happened during or after the iteration.
	Event string `json:"event,omitempty"`
}

// WriteTable prints the iteration's per-stage breakdown.
func (s IterStats) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "iter %d  loss %.4f  acc %.3f  %.1f ms  (plan %d)\n", s.Iter, s.Loss, s.Accuracy, 1e3*s.Seconds, s.Gen)
	for _, st := range s.Stages {
		fmt.Fprintf(w, "  stage %d %-10s layers [%3d,%3d)  compute %7.1f ms (cpu %6.1f)  comm %6.1f ms  idle %7.1f ms  %6.2f GFLOP/s\n",
			st.Stage, st.Worker, st.First, st.Last, 1e3*st.Compute, 1e3*st.CPU, 1e3*st.Comm, 1e3*st.Idle, st.Speed/1e9)
	}
	if s.Event != "" {
		fmt.Fprintf(w, "  %s\n", s.Event)
	}
}

// assignment is one stage of the running plan.
type assignment struct {
	worker      int // index into the coordinator's workers
	first, last int
}

// Session is a pipeline training run on a coordinator's workers. It is not
// safe for concurrent use.
type Session struct {
	c      *Coordinator
	cfg    SessionConfig
	ref    *nn.Sequential // the model's structure (costs, parameter names)
	base   *alloc.Model   // FLOP-counted layers (memory, sizes)
	amodel *alloc.Model   // layers with calibrated work for the schedule
	cm     *costModel     // nil until the first profile
	// links between regions (sorted pair) and from the coordinator to a
	// region, as measured.
	links      map[[2]string]alloc.Link
	coordLinks map[string]alloc.Link
	tmpDir     string

	gen    uint64
	iter   int
	stages []assignment
	drift  driftDetector // of the running plan
}

// Start profiles the live workers, plans the pipeline, snapshots the
// initial state to the checkpoint and installs the stages.
func (c *Coordinator) Start(ctx context.Context, cfg SessionConfig) (*Session, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	ref, err := BuildModel(cfg.Model, cfg.Seed)
	if err != nil {
		return nil, err
	}
	s := &Session{c: c, cfg: cfg, ref: ref}
	s.base = AllocModel(cfg.Model, ref, cfg.Batch, cfg.Schedule.Micro(cfg.Micro))
	s.amodel = s.base
	if s.cfg.Checkpoint == "" {
		if s.tmpDir, err = os.MkdirTemp("", "skyhive-pipeline-"); err != nil {
			return nil, fmt.Errorf("pipeline: checkpoint directory: %w", err)
		}
		s.cfg.Checkpoint = filepath.Join(s.tmpDir, "pipeline.safetensors")
	}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	snap, err := s.initialSnapshot()
	if err != nil {
		return nil, err
	}
	if err := s.profile(ctx); err != nil {
		return nil, err
	}
	if err := s.measureLinks(ctx); err != nil {
		return nil, err
	}
	if err := s.save(snap); err != nil {
		return nil, err
	}
	plan, err := s.choosePlan(ctx, cfg.Strategy, cfg.Plan)
	if err != nil {
		return nil, err
	}
	if err := s.apply(ctx, plan, snap); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// initialSnapshot is the model's initial weights and a fresh optimizer
// state, or the checkpoint when resuming.
func (s *Session) initialSnapshot() (Snapshot, error) {
	if s.cfg.Resume {
		snap, iter, err := s.load()
		if err == nil {
			s.iter = iter
			fmt.Fprintf(s.cfg.Log, "resumed from %s at iteration %d\n", s.cfg.Checkpoint, iter)
			return snap, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return Snapshot{}, err
		}
	}
	params := s.ref.Params()
	st := s.cfg.Optim.NewOptimizer(params).State()
	return Snapshot{Params: nn.ExportParams(params), Optim: st.Tensors, Step: st.Step}, nil
}

// Close removes the temporary checkpoint directory, if any. Workers keep
// running; Coordinator.Shutdown stops them.
func (s *Session) Close() {
	if s.tmpDir != "" {
		os.RemoveAll(s.tmpDir)
		s.tmpDir = ""
	}
}

// Iter is the number of committed iterations.
func (s *Session) Iter() int { return s.iter }

// CheckpointPath is where the session snapshots its state.
func (s *Session) CheckpointPath() string { return s.cfg.Checkpoint }

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
		if c := cmpStr(a.A, b.A); c != 0 {
			return c
		}
		return cmpStr(a.B, b.B)
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

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
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
		fmt.Fprintf(s.cfg.Log, "worker %-8s slowdown %5.2f  region %-8s %6.2f GFLOP/s  (emulated %.1f ms for %.1f ms CPU at batch %d, %.2f ms late)\n",
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
		s.cm.opOverhead = median(overs)
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
	cm.modelFLOPs = s.ref.Cost([]int{req.Batch, InputFeatures}).TotalFLOPs()
	for _, c := range s.ref.LayerCosts([]int{1, InputFeatures}) {
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
	stages := make([]simStage, len(p.Stages))
	for k, st := range p.Stages {
		d := cl.Devices[st.Device]
		stages[k] = simStage{first: st.First, last: st.Last, factor: s.cm.factor(d.Speed), coord: s.coordLinks[d.Region]}
		if k+1 < len(p.Stages) {
			stages[k].next = cl.Link(st.Device, p.Stages[k+1].Device)
		}
	}
	return s.cm.simulate(stages, s.cfg.Schedule, s.microSizes(s.cfg.Batch)), nil
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
		req.Pin = s.c.emu != nil
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
	return nil
}

// stageError is a failure attributed to one worker.
type stageError struct {
	worker int
	err    error
}

func (e *stageError) Error() string { return e.err.Error() }
func (e *stageError) Unwrap() error { return e.err }

// Snapshot fetches every stage's weights and optimizer state.
func (s *Session) Snapshot(ctx context.Context) (Snapshot, error) {
	out := Snapshot{}
	for k, a := range s.stages {
		part, err := s.fetch(ctx, a.worker)
		if err != nil {
			return Snapshot{}, &stageError{worker: a.worker, err: fmt.Errorf("pipeline: fetching stage %d: %w", k, err)}
		}
		out.merge(part)
	}
	return out, nil
}

func (s *Session) fetch(ctx context.Context, worker int) (Snapshot, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var resp fetchResp
	ts, err := s.c.call(cctx, worker, ProtoFetch, fetchReq{Gen: s.gen}, nil, &resp, bulkLimits)
	if err != nil {
		return Snapshot{}, err
	}
	return snapshotFrom(namedMap(ts), resp.Step)
}

// gather collects the current state from the live stages and fills what
// the dead ones held from the checkpoint.
func (s *Session) gather(ctx context.Context) (Snapshot, error) {
	out := Snapshot{}
	parts := make([]Snapshot, len(s.stages))
	errs := make([]error, len(s.stages))
	var wg sync.WaitGroup
	for k, a := range s.stages {
		if !s.c.worker(a.worker).alive(s.c) {
			errs[k] = errors.New("dead")
			continue
		}
		wg.Go(func() { parts[k], errs[k] = s.fetch(ctx, a.worker) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		return Snapshot{}, ctx.Err()
	}
	for k, a := range s.stages {
		if errs[k] != nil {
			s.c.markDead(a.worker)
			continue
		}
		out.merge(parts[k])
	}
	missing := 0
	for _, p := range s.ref.Params() {
		if _, ok := out.Params[p.Name]; !ok {
			missing++
		}
	}
	if missing > 0 || len(s.stages) == 0 {
		ck, iter, err := s.load()
		if err != nil {
			return Snapshot{}, fmt.Errorf("pipeline: %d parameters lost with their workers and no checkpoint: %w", missing, err)
		}
		fmt.Fprintf(s.cfg.Log, "%s restoring %d parameters from the checkpoint of iteration %d\n", time.Now().Format("15:04:05.000"), missing, iter)
		out.merge(ck)
	}
	if out.Step == 0 {
		out.Step = int64(s.iter)
	}
	return out, nil
}

// save writes a snapshot to the checkpoint file atomically.
func (s *Session) save(snap Snapshot) error {
	meta := map[string]string{
		"format": "skyhive-pipeline", "model": s.cfg.Model, "seed": strconv.FormatUint(s.cfg.Seed, 10),
		"iter": strconv.Itoa(s.iter), "step": strconv.FormatInt(snap.Step, 10),
	}
	if err := checkpoint.Save(s.cfg.Checkpoint, snap.tensors(), meta); err != nil {
		return fmt.Errorf("pipeline: checkpoint: %w", err)
	}
	return nil
}

// load reads the checkpoint file.
func (s *Session) load() (Snapshot, int, error) {
	f, err := checkpoint.Load(s.cfg.Checkpoint)
	if err != nil {
		return Snapshot{}, 0, err
	}
	if f.Meta["model"] != s.cfg.Model || f.Meta["seed"] != strconv.FormatUint(s.cfg.Seed, 10) {
		return Snapshot{}, 0, fmt.Errorf("pipeline: checkpoint %s is of model %q seed %s, not %q seed %d", s.cfg.Checkpoint, f.Meta["model"], f.Meta["seed"], s.cfg.Model, s.cfg.Seed)
	}
	iter, err1 := strconv.Atoi(f.Meta["iter"])
	step, err2 := strconv.ParseInt(f.Meta["step"], 10, 64)
	if err1 != nil || err2 != nil || iter < 0 || step < 0 {
		return Snapshot{}, 0, fmt.Errorf("pipeline: checkpoint %s lacks iteration metadata", s.cfg.Checkpoint)
	}
	snap, err := snapshotFrom(f.Tensors, step)
	return snap, iter, err
}

// Step trains on one batch. If a worker fails or times out it re-plans on
// the remaining workers (restoring lost layers from the checkpoint) and
// retries the batch, up to MaxRecoveries times.
func (s *Session) Step(ctx context.Context, b data.Batch) (IterStats, error) {
	if b.Len() < s.cfg.Schedule.Micro(s.cfg.Micro) || b.Len() > maxBatch || b.X == nil || b.X.Len() != b.Len()*InputFeatures {
		return IterStats{}, fmt.Errorf("pipeline: batch of %d examples does not fit the session", b.Len())
	}
	var event string
	for attempt := 0; ; attempt++ {
		st, committed, err := s.tryIter(ctx, b)
		if committed {
			s.iter++
		}
		if err == nil {
			st.Event = event
			if s.iter%s.cfg.CheckpointEvery == 0 {
				if err := s.checkpoint(ctx); err != nil {
					fmt.Fprintf(s.cfg.Log, "checkpoint failed: %v\n", err)
				}
			}
			if reason := s.drifted(st); reason != "" {
				changed, err := s.replan(ctx, reason)
				if err != nil {
					return st, err
				}
				if changed {
					st.Event = joinEvent(st.Event, "re-planned: "+reason)
				}
			}
			return st, nil
		}
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		if attempt >= s.cfg.MaxRecoveries {
			return st, fmt.Errorf("pipeline: iteration %d failed after %d re-plans: %w", s.iter, attempt, err)
		}
		if rerr := s.recover(ctx, err); rerr != nil {
			return st, rerr
		}
		event = joinEvent(event, fmt.Sprintf("re-planned after failure: %v", err))
		if committed {
			return st, nil // the batch was learned; the failure hit the commit
		}
	}
}

func joinEvent(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// checkpoint snapshots all stages to the checkpoint file.
func (s *Session) checkpoint(ctx context.Context) error {
	snap, err := s.Snapshot(ctx)
	if err != nil {
		return err
	}
	return s.save(snap)
}

// tryIter runs one iteration on the current plan and commits it.
func (s *Session) tryIter(ctx context.Context, b data.Batch) (IterStats, bool, error) {
	n := b.Len()
	sizes := s.microSizes(n)
	x := tensor.FromSlice(b.X.Data, n, InputFeatures)
	y := tensor.New(n)
	for i, v := range b.Y {
		y.Data[i] = float32(v)
	}
	start := time.Now()
	ictx, cancel := context.WithTimeoutCause(ctx, s.cfg.IterTimeout+5*time.Second, errors.New("iteration timed out"))
	defer cancel()
	S := len(s.stages)
	resps := make([]iterResp, S)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for k, a := range s.stages {
		wg.Go(func() {
			req := iterReq{Gen: s.gen, Iter: s.iter, Schedule: s.cfg.Schedule, Sizes: sizes, TimeoutMS: s.cfg.IterTimeout.Milliseconds()}
			var ts []wire.Named
			if k == 0 {
				ts = append(ts, wire.Named{Name: "x", Tensor: x})
			}
			if k == S-1 {
				ts = append(ts, wire.Named{Name: "y", Tensor: y})
			}
			_, err := s.c.call(ictx, a.worker, ProtoIter, req, ts, &resps[k], wire.Limits{})
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = &stageError{worker: a.worker, err: fmt.Errorf("stage %d (%s): %w", k, s.c.worker(a.worker).Name, err)}
					cancel()
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return IterStats{}, false, firstErr
	}
	var sq float64
	for _, r := range resps {
		sq += r.GradSq
	}
	loss := resps[S-1].Loss
	if math.IsNaN(loss) || math.IsNaN(sq) {
		return IterStats{}, false, fmt.Errorf("pipeline: iteration %d: loss or gradient is NaN", s.iter)
	}
	scale := 1.0
	if norm := math.Sqrt(sq); s.cfg.ClipNorm > 0 && norm > s.cfg.ClipNorm {
		scale = s.cfg.ClipNorm / norm
	}
	lr := s.cfg.Optim.LR
	if s.cfg.LRSchedule != nil {
		lr = s.cfg.LRSchedule.LR(int64(s.iter))
	}
	commits := make([]commitResp, S)
	cerrs := make([]error, S)
	for k, a := range s.stages {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, s.cfg.IterTimeout)
			defer cancel()
			_, cerrs[k] = s.c.call(cctx, a.worker, ProtoCommit, commitReq{Gen: s.gen, Iter: s.iter, LR: lr, Scale: scale}, nil, &commits[k], wire.Limits{})
		})
	}
	wg.Wait()
	st := IterStats{Iter: s.iter, Gen: s.gen, Loss: loss, Accuracy: float64(resps[S-1].Correct) / float64(n), Seconds: time.Since(start).Seconds()}
	for k, a := range s.stages {
		r := resps[k]
		t := StageTiming{
			Stage: k, Worker: s.c.worker(a.worker).Name, First: a.first, Last: a.last,
			Compute: r.Compute + commits[k].Seconds, Comm: r.Comm, Idle: r.Idle, Wall: r.Wall + commits[k].Seconds, CPU: r.CPU,
		}
		if r.Compute > 0 {
			t.Speed = s.stageFLOPs(a) / r.Compute
		}
		st.Stages = append(st.Stages, t)
	}
	for k, err := range cerrs {
		if err != nil {
			return st, true, &stageError{worker: s.stages[k].worker, err: fmt.Errorf("commit on stage %d: %w", k, err)}
		}
	}
	return st, true, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// stageFLOPs is the forward+backward work of a stage for one batch.
func (s *Session) stageFLOPs(a assignment) float64 {
	f := 0.0
	for _, l := range s.amodel.Layers[a.first:a.last] {
		f += l.FwdFLOPs + l.BwdFLOPs
	}
	return f
}

// drifted feeds the iteration's measured stage speeds to the drift
// detector and reports why the plan should be redone, or "". On drift,
// every worker's planning speed is scaled by its stage's change.
func (s *Session) drifted(st IterStats) string {
	speeds := make([]float64, len(st.Stages))
	for k, t := range st.Stages {
		speeds[k] = t.Speed
	}
	d, ok := s.drift.observe(speeds)
	if !ok {
		return ""
	}
	for k, a := range s.stages {
		if d.speeds[k] > 0 {
			s.c.setSpeed(a.worker, d.speeds[k])
		}
	}
	return fmt.Sprintf("stage %d (%s) runs at %.0f%% of its speed at planning", d.stage, st.Stages[d.stage].Worker, 100*d.ratio)
}

// recover handles a failed iteration: it stops the others, finds the dead
// workers and re-plans on the live ones.
func (s *Session) recover(ctx context.Context, cause error) error {
	fmt.Fprintf(s.cfg.Log, "%s recovering from: %v\n", time.Now().Format("15:04:05.000"), cause)
	var wg sync.WaitGroup
	for _, a := range s.stages {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			s.c.call(cctx, a.worker, ProtoAbort, abortReq{Gen: s.gen, Iter: s.iter}, nil, nil, wire.Limits{})
		})
	}
	wg.Wait()
	for _, w := range s.c.Workers() {
		if !w.Alive {
			continue
		}
		wg.Go(func() {
			if err := s.c.ping(ctx, w.Index, 3*time.Second); err != nil && ctx.Err() == nil {
				s.c.markDead(w.Index)
			}
		})
	}
	wg.Wait()
	_, err := s.replan(ctx, "failure")
	return err
}

// samePlan reports whether plan (worker indices) is the running plan and
// all its workers are alive.
func (s *Session) samePlan(plan alloc.Plan) bool {
	if len(plan.Stages) != len(s.stages) {
		return false
	}
	for k, st := range plan.Stages {
		a := s.stages[k]
		if st.Device != a.worker || st.First != a.first || st.Last != a.last || !s.c.worker(a.worker).alive(s.c) {
			return false
		}
	}
	return true
}

// replan gathers the state, profiles newcomers, solves the allocation
// on the live workers and installs the result.
func (s *Session) replan(ctx context.Context, reason string) (changed bool, err error) {
	for attempt := 0; ; attempt++ {
		snap, err := s.gather(ctx)
		if err != nil {
			return false, err
		}
		if err := s.profile(ctx); err != nil {
			return false, err
		}
		plan, err := s.choosePlan(ctx, s.cfg.Strategy, nil)
		if err != nil {
			return false, err
		}
		if s.samePlan(plan) {
			// Only the speeds changed: keep the layers where they are and
			// measure new baselines.
			fmt.Fprintf(s.cfg.Log, "%s plan unchanged at iteration %d (%s)\n", time.Now().Format("15:04:05.000"), s.iter, reason)
			planned := make([]float64, len(s.stages))
			for k, a := range s.stages {
				planned[k] = s.c.worker(a.worker).speed(s.c)
			}
			s.drift.reset(planned)
			return false, nil
		}
		fmt.Fprintf(s.cfg.Log, "%s re-planned at iteration %d (%s)\n", time.Now().Format("15:04:05.000"), s.iter, reason)
		err = s.apply(ctx, plan, snap)
		if err == nil {
			return true, nil
		}
		var se *stageError
		if attempt >= s.cfg.MaxRecoveries || !errors.As(err, &se) || ctx.Err() != nil {
			return false, err
		}
		if perr := s.c.ping(ctx, se.worker, 3*time.Second); perr == nil {
			return false, err // a live worker refused its stage (e.g. memory)
		}
		s.c.markDead(se.worker)
	}
}

// SetSchedule switches the schedule and micro-batch count from the next
// iteration on; the layers stay where they are.
func (s *Session) SetSchedule(sched Schedule, micro int) error {
	cfg := s.cfg
	cfg.Schedule, cfg.Micro = sched, micro
	if err := cfg.defaults(); err != nil {
		return err
	}
	s.cfg = cfg
	if s.cm != nil {
		s.amodel = s.cm.allocModel(s.base, cfg.Batch, sched.Micro(cfg.Micro))
	} else {
		s.amodel.MicroBatches = sched.Micro(cfg.Micro)
	}
	return nil
}
