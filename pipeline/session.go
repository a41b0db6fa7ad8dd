package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
)

// SessionConfig configures a pipeline training run.
type SessionConfig struct {
	// Model is a spec of package models; Seed seeds its initialisation.
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
	// CPU is the busy time of the forward and backward passes (wall time
	// less waits for a core, see opClock), without the emulated slowdown;
	// with steady workers (WorkerConfig.Steady), the steady busy times the
	// device emulated.
	CPU float64 `json:"cpu"`
	// Step is the optimizer step's time, part of Compute and Wall.
	Step float64 `json:"step"`
	// OpCV is the coefficient of variation of the compute times of the
	// stage's ops of one kind (direction and micro-batch size), pooled:
	// how much the device's op times vary, which lengthens a pipeline
	// whose stages wait for each other.
	OpCV float64 `json:"op_cv"`
	// Speed is the measured FLOP/s of the stage's forward+backward.
	Speed float64 `json:"speed"`
}

// IterStats reports one training iteration.
type IterStats struct {
	Iter int    `json:"iter"`
	Gen  uint64 `json:"gen"`
	// Loss is the batch's mean cross-entropy: per example for an image
	// classifier, per token for a language model.
	Loss float64 `json:"loss"`
	// Accuracy is the fraction of labels predicted (argmax): of the
	// batch's images, or of its next tokens.
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
		fmt.Fprintf(w, "  stage %d %-10s layers [%3d,%3d)  compute %7.1f ms (busy %6.1f)  comm %6.1f ms  idle %7.1f ms  %6.2f GFLOP/s\n",
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
	info   ModelInfo      // what one example of the model is
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
	ref, info, err := buildModel(cfg.Model, cfg.Seed)
	if err != nil {
		return nil, err
	}
	s := &Session{c: c, cfg: cfg, ref: ref, info: info}
	if info.lm() {
		fmt.Fprintf(cfg.Log, "language model %s: sequences of %d tokens, vocabulary %d; output head untied from the token embedding (its own [%d, %d] weight), as stages cannot share a table\n",
			cfg.Model, info.GPT.Seq, info.GPT.Vocab, info.GPT.Vocab, info.GPT.Hidden)
	}
	s.base = AllocModelOf(cfg.Model, ref, info.Input, cfg.Batch, cfg.Schedule.Micro(cfg.Micro))
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

// stageError is a failure attributed to one worker.
type stageError struct {
	worker int
	err    error
}

func (e *stageError) Error() string { return e.err.Error() }
func (e *stageError) Unwrap() error { return e.err }

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
