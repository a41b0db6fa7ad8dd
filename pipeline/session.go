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
		fmt.Fprintf(w, "  stage %d %-10s layers [%3d,%3d)  compute %7.1f ms  comm %6.1f ms  idle %7.1f ms  %6.2f GFLOP/s\n",
			st.Stage, st.Worker, st.First, st.Last, 1e3*st.Compute, 1e3*st.Comm, 1e3*st.Idle, st.Speed/1e9)
	}
	if s.Event != "" {
		fmt.Fprintf(w, "  %s\n", s.Event)
	}
}

// assignment is one stage of the running plan.
type assignment struct {
	worker      int // index into the coordinator's workers
	first, last int
	planned     float64 // the worker's speed the plan assumed
	ema         float64 // smoothed measured speed of the stage
	baseline    float64 // ema early in the plan; 0 until known
	drift       int     // consecutive iterations off by more than the threshold
}

// Session is a pipeline training run on a coordinator's workers. It is not
// safe for concurrent use.
type Session struct {
	c      *Coordinator
	cfg    SessionConfig
	ref    *nn.Sequential // the model's structure (costs, parameter names)
	amodel *alloc.Model
	link   alloc.Link
	tmpDir string

	gen       uint64
	iter      int
	stages    []assignment
	sincePlan int
	// calibrated is set once amodel's layer costs come from measured times.
	calibrated bool
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
	s.amodel = AllocModel(cfg.Model, ref, cfg.Batch, cfg.Schedule.Micro(cfg.Micro))
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
	if err := s.measureLink(ctx); err != nil {
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
// their coordinator indices.
func (s *Session) cluster() (*alloc.Cluster, []int) {
	cl := &alloc.Cluster{Intra: s.link, Inter: s.link}
	var idx []int
	for _, w := range s.c.Workers() {
		if !w.Alive || !(w.Speed > 0) {
			continue
		}
		mem := w.MemCap
		if mem <= 0 {
			mem = 1 << 50
		}
		cl.Devices = append(cl.Devices, alloc.Device{Name: w.Name, Speed: w.Speed, MemBytes: mem, Region: "local"})
		idx = append(idx, w.Index)
	}
	return cl, idx
}

// profile measures every live worker that has no speed yet, one at a
// time so they do not compete for the CPU.
func (s *Session) profile(ctx context.Context) error {
	mb := (s.cfg.Batch + s.cfg.Schedule.Micro(s.cfg.Micro) - 1) / s.cfg.Schedule.Micro(s.cfg.Micro)
	n := 0
	for _, w := range s.c.Workers() {
		if !w.Alive {
			continue
		}
		if w.Speed > 0 {
			n++
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		var resp profileResp
		_, err := s.c.call(cctx, w.Index, ProtoProfile, profileReq{Model: s.cfg.Model, Seed: s.cfg.Seed, Batch: mb, Reps: s.cfg.ProfileReps}, nil, &resp, wire.Limits{})
		cancel()
		if err != nil || !(resp.FLOPS > 0) || math.IsInf(resp.FLOPS, 0) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			fmt.Fprintf(s.cfg.Log, "profiling %s failed: %v\n", w.Name, err)
			s.c.markDead(w.Index)
			continue
		}
		if !s.calibrated {
			if err := s.calibrate(resp); err != nil {
				return err
			}
		}
		s.c.setSpeed(w.Index, resp.FLOPS)
		fmt.Fprintf(s.cfg.Log, "worker %-8s slowdown %.2f  %.2f GFLOP/s\n", w.Name, w.Slowdown, resp.FLOPS/1e9)
		n++
	}
	if n == 0 {
		return errors.New("pipeline: no live worker")
	}
	return nil
}

// calibrate replaces the layers' FLOP counts by effective work: the first
// profiled worker's measured time per layer times its FLOP/s. Layers with
// few FLOPs but real cost (activations, small GEMMs, per-call overhead)
// thus weigh what they take, and every device's speed is measured in the
// same unit. The forward/backward split keeps the FLOP ratio.
func (s *Session) calibrate(r profileResp) error {
	if len(r.LayerSeconds) != len(s.amodel.Layers) {
		return fmt.Errorf("pipeline: profile has %d layer times for %d layers", len(r.LayerSeconds), len(s.amodel.Layers))
	}
	for _, v := range r.LayerSeconds {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("pipeline: bad layer time %v in profile", v)
		}
	}
	for i := range s.amodel.Layers {
		l := &s.amodel.Layers[i]
		eff := r.LayerSeconds[i] * r.FLOPS * float64(s.cfg.Schedule.Micro(s.cfg.Micro)) // per batch
		if tot := l.FwdFLOPs + l.BwdFLOPs; tot > 0 {
			l.FwdFLOPs, l.BwdFLOPs = eff*l.FwdFLOPs/tot, eff*l.BwdFLOPs/tot
		} else {
			l.FwdFLOPs, l.BwdFLOPs = eff/3, 2*eff/3
		}
	}
	s.calibrated = true
	return nil
}

// measureLink estimates the latency and bandwidth of the network from
// round trips to one worker: latency is half an empty round trip,
// bandwidth what a 4 MiB request adds to it.
func (s *Session) measureLink(ctx context.Context) error {
	_, idx := s.cluster()
	if len(idx) == 0 {
		return errors.New("pipeline: no live worker")
	}
	w := s.c.worker(idx[0])
	s.c.mu.Lock()
	ai := w.Peer
	s.c.mu.Unlock()
	big := make([]byte, 4<<20)
	var small, large []float64
	for i := range 6 {
		for _, b := range [][]byte{nil, big} {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			t0 := time.Now()
			_, err := s.c.host.Call(cctx, ai, ProtoPing, b)
			d := time.Since(t0).Seconds()
			cancel()
			if err != nil {
				return fmt.Errorf("pipeline: measuring the link to %s: %w", w.Name, err)
			}
			if i == 0 {
				continue // warm-up
			}
			if b == nil {
				small = append(small, d)
			} else {
				large = append(large, d)
			}
		}
	}
	slices.Sort(small)
	slices.Sort(large)
	rtt, big4 := small[len(small)/2], large[len(large)/2]
	s.link = alloc.Link{Latency: rtt / 2}
	if big4 > rtt {
		s.link.Bandwidth = float64(len(big)) / (big4 - rtt)
	}
	fmt.Fprintf(s.cfg.Log, "link: latency %.3f ms, bandwidth %.0f MB/s\n", 1e3*s.link.Latency, s.link.Bandwidth/1e6)
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
		res, err := alloc.Solve(ctx, strategy, alloc.Problem{Cluster: cl, Model: s.amodel})
		if err != nil {
			return alloc.Plan{}, fmt.Errorf("pipeline: plan with %s: %w", strategy, err)
		}
		plan = res.Plan
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

// Predict returns the cost model's report of a plan (device indices as in
// Problem) for the session's model on the live workers.
func (s *Session) Predict(p alloc.Plan) (*alloc.Report, error) {
	pr := s.Problem()
	return alloc.Evaluate(pr.Cluster, pr.Model, p)
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
	used := map[int]bool{}
	for k, st := range plan.Stages {
		w := s.c.worker(st.Device)
		s.c.mu.Lock()
		speed := w.Speed
		s.c.mu.Unlock()
		stages[k] = assignment{worker: st.Device, first: st.First, last: st.Last, planned: speed}
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
		if k > 0 {
			req.Prev = refOf(s.c.Workers()[stages[k-1].worker].Peer)
		}
		if k+1 < len(stages) {
			req.Next = refOf(s.c.Workers()[stages[k+1].worker].Peer)
		}
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
	s.sincePlan = 0
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
	for _, a := range s.stages {
		if !s.c.worker(a.worker).alive(s.c) {
			continue
		}
		part, err := s.fetch(ctx, a.worker)
		if err != nil {
			if ctx.Err() != nil {
				return Snapshot{}, ctx.Err()
			}
			s.c.markDead(a.worker)
			continue
		}
		out.merge(part)
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
			s.sincePlan++
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
	m := s.cfg.Schedule.Micro(s.cfg.Micro)
	sizes := make([]int, m)
	for i := range sizes {
		sizes[i] = n/m + btoi(i < n%m)
	}
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
			Compute: r.Compute + commits[k].Seconds, Comm: r.Comm, Idle: r.Idle, Wall: r.Wall + commits[k].Seconds,
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

// drifted tracks each stage's measured speed and reports why the plan
// should be redone, or "". A stage's baseline is its smoothed speed in
// the first iterations of the plan (its layers, its neighbours); drift is
// a change of the smoothed speed relative to that baseline, which is
// robust to the different efficiency of different layers. On drift, every
// worker's planning speed is scaled by its change.
func (s *Session) drifted(st IterStats) string {
	if s.sincePlan <= 1 || s.cfg.ReplanThreshold <= 0 {
		return "" // the first iteration after a setup warms up
	}
	reason := ""
	for k := range s.stages {
		a := &s.stages[k]
		sp := st.Stages[k].Speed
		if !(sp > 0) {
			continue
		}
		if a.ema == 0 {
			a.ema = sp
		} else {
			a.ema = 0.5*a.ema + 0.5*sp
		}
		if a.baseline == 0 {
			if s.sincePlan >= 3 {
				a.baseline = a.ema
			}
			continue
		}
		if math.Abs(a.ema/a.baseline-1) > s.cfg.ReplanThreshold {
			a.drift++
		} else {
			a.drift = 0
		}
		if a.drift >= s.cfg.ReplanPatience && reason == "" {
			reason = fmt.Sprintf("stage %d (%s) runs at %.0f%% of its speed at planning", k, st.Stages[k].Worker, 100*a.ema/a.baseline)
		}
	}
	if reason != "" {
		for _, a := range s.stages {
			if a.baseline > 0 {
				s.c.setSpeed(a.worker, a.planned*a.ema/a.baseline)
			}
		}
	}
	return reason
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
			for k := range s.stages {
				a := &s.stages[k]
				a.planned, a.ema, a.baseline, a.drift = s.c.worker(a.worker).speed(s.c), 0, 0, 0
			}
			s.sincePlan = 0
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
	s.amodel.MicroBatches = sched.Micro(cfg.Micro)
	return nil
}
