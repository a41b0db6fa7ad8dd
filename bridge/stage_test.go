package bridge

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/p2p/memnet"
	"github.com/skyhive/skyhive/pipeline"
	"github.com/skyhive/skyhive/text"
)

// stageText is a few dictionary-style definitions, written for this test.
const stageText = `Anchor, n. A heavy iron instrument, lowered from a ship by a cable, which
holds the vessel in place. Beacon, n. A signal fire kept burning on a height,
to give warning or to guide ships at night. Harbor, n. A place of security; a
part of the sea so sheltered by the land that ships may lie there in safety.
Lantern, n. Something inclosing a light, and protecting it from the wind and
rain. Tide, n. The alternate rising and falling of the waters of the ocean.`

// torchPipeline starts a coordinator and one worker per executor on an
// in-memory network; workers without an executor compute in Go.
func torchPipeline(t *testing.T, ctx context.Context, execs []*Executor) *pipeline.Coordinator {
	t.Helper()
	net := memnet.NewNetwork()
	peer := func() *memnet.Peer {
		p, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	ctx, cancel := context.WithCancel(ctx)
	c, err := pipeline.NewCoordinator(ctx, pipeline.CoordinatorConfig{Transport: peer()})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var workers []*pipeline.Worker
	t.Cleanup(func() {
		cancel()
		for _, w := range workers {
			w.Close()
		}
		wg.Wait()
		c.Close()
		net.Close()
	})
	for i, ex := range execs {
		cfg := pipeline.WorkerConfig{Name: fmt.Sprintf("w%d", i), Join: c.Addrs()[0], Transport: peer(), Heartbeat: 200 * time.Millisecond}
		if ex != nil {
			cfg.Executor = ex
		}
		w, err := pipeline.NewWorker(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
		wg.Go(func() { _ = w.Run(ctx) })
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		err = c.WaitWorkers(wctx, i+1)
		wcancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// TestPipelineStagesInPyTorch splits a GPT over 3 workers whose layers
// compute in PyTorch executors and checks it against the same model in
// one process (the Go model, which python/tests/test_twins.py checks
// against PyTorch): the first loss (forward) and every parameter's
// gradient (backward; an SGD step of learning rate 1 from the same
// weights) within 1e-5, then 4 AdamW steps' losses under 1F1B. A worker
// in Go next to them takes its layers with their optimizer state when the
// plan moves them.
func TestPipelineStagesInPyTorch(t *testing.T) {
	needTorch(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	tok, err := text.TrainBPE([]byte(stageText), 300)
	if err != nil {
		t.Fatal(err)
	}
	smp, err := text.NewSampler(tok.Encode([]byte(stageText)), 6, 16, 5)
	if err != nil {
		t.Fatal(err)
	}
	const spec, seed = "gpt-mini:300x16", 13
	execs := make([]*Executor, 3)
	for i := range execs {
		execs[i] = testExecutor(t, StageModule, 0, 1<<20)
	}
	c := torchPipeline(t, ctx, append(execs, nil))
	// gpt-mini's layers: 0 embed, 1 pos, 2 drop, 3–6 dec, 7 ln, 8 head.
	plan := &alloc.Plan{Stages: []alloc.Stage{{Device: 0, First: 0, Last: 3}, {Device: 1, First: 3, Last: 6}, {Device: 2, First: 6, Last: 9}}}
	var log strings.Builder
	s, err := c.Start(ctx, pipeline.SessionConfig{Model: spec, Seed: seed, Batch: 6, Micro: 3, Schedule: pipeline.GPipe,
		Optim: pipeline.OptimConfig{Kind: "sgd", LR: 1}, Plan: plan, ProfileReps: 1, Log: &log})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	defer s.Close()
	// Profiling built the whole model in every executor, and freed it.
	if _, err := execs[0].StageGradSq(ctx, "profile"); err == nil || !strings.Contains(err.Error(), "no stage was built") {
		t.Errorf("the profiled model after profiling: %v, want it gone", err)
	}

	// The reference: the whole model in one process, from the same seed.
	ref, err := pipeline.BuildModel(spec, seed)
	if err != nil {
		t.Fatal(err)
	}
	b := smp.Next()
	logits, st := ref.Forward(nn.Ctx{Train: true}, b.X)
	want, dl := nn.SequenceCrossEntropy(logits, b.Labels())
	ref.Backward(st, dl)
	w0 := nn.ExportParams(ref.Params())
	it, err := s.StepTokens(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if d := math.Abs(it.Loss - float64(want)); d > 1e-5*float64(want) {
		t.Fatalf("loss %.7f through PyTorch stages, %.7f in one process", it.Loss, want)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var worst float64
	for _, p := range ref.Params() {
		w1 := snap.Params[p.Name]
		if w1 == nil {
			t.Fatalf("no %s in the snapshot", p.Name)
		}
		scale := 1e-3
		for _, g := range p.Grad.Data {
			scale = max(scale, math.Abs(float64(g)))
		}
		for j, g := range p.Grad.Data {
			// SGD with learning rate 1: w1 = w0 − g, rounded to float32
			// (half a unit in the last place of w1: 2⁻²⁴·|w1|).
			a, b := float64(w0[p.Name].Data[j]), float64(w1.Data[j])
			got := a - b
			d := math.Max(0, math.Abs(got-float64(g))-math.Abs(b)*0x1p-24) / scale
			worst = max(worst, d)
			if d > 1e-5 {
				t.Fatalf("%s[%d]: gradient %.8g through PyTorch stages, %.8g in one process", p.Name, j, got, g)
			}
		}
	}
	t.Logf("loss %.6f (one process %.6f); largest gradient difference %.2g of each tensor's largest gradient", it.Loss, want, worst)
	s.Close()

	// AdamW under 1F1B, the middle layers moved with their optimizer
	// state from PyTorch to Go and on to another PyTorch worker (a new
	// coordinator: one coordinator runs one session).
	for i := range execs {
		execs[i] = testExecutor(t, StageModule, 0, 1<<20)
	}
	c = torchPipeline(t, ctx, append(execs, nil))
	o := pipeline.OptimConfig{LR: 3e-3, WeightDecay: 0.01}
	s, err = c.Start(ctx, pipeline.SessionConfig{Model: spec, Seed: seed, Batch: 6, Micro: 3, Schedule: pipeline.OneFOneB,
		Optim: o, Plan: plan, ProfileReps: 1, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ref, err = pipeline.BuildModel(spec, seed)
	if err != nil {
		t.Fatal(err)
	}
	opt := o.NewOptimizer(ref.Params())
	plans := [][]alloc.Stage{
		plan.Stages,
		{{Device: 0, First: 0, Last: 3}, {Device: 3, First: 3, Last: 6}, {Device: 2, First: 6, Last: 9}},
		{{Device: 0, First: 0, Last: 3}, {Device: 1, First: 3, Last: 9}},
	}
	for i := range 6 {
		if i%2 == 0 && i > 0 {
			if err := s.SetPlan(ctx, alloc.Plan{Stages: plans[i/2]}); err != nil {
				t.Fatal(err)
			}
		}
		b := smp.Next()
		opt.ZeroGrad()
		logits, st := ref.Forward(nn.Ctx{Train: true}, b.X)
		want, dl := nn.SequenceCrossEntropy(logits, b.Labels())
		ref.Backward(st, dl)
		opt.Step()
		it, err := s.StepTokens(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		if d := math.Abs(it.Loss - float64(want)); d > 1e-4*float64(want) {
			t.Fatalf("step %d (plan %v): loss %.7f through the pipeline, %.7f in one process", i, plans[i/2], it.Loss, want)
		}
		t.Logf("step %d: loss %.6f (one process %.6f)", i, it.Loss, want)
	}
	s.Close()

	// Iterations that time out at once (IterTimeout 1 ms) fail and are
	// re-planned, but the executors live on: a call to one is never
	// cancelled midway (its state would be lost; the bridge kills an
	// executor whose answer it stops waiting for).
	for i := range 2 {
		execs[i] = testExecutor(t, StageModule, 0, 1<<20)
	}
	c = torchPipeline(t, ctx, execs[:2])
	s, err = c.Start(ctx, pipeline.SessionConfig{Model: spec, Seed: seed, Batch: 6, Micro: 3, Schedule: pipeline.GPipe,
		Optim: o, ProfileReps: 1, IterTimeout: time.Millisecond, MaxRecoveries: 1, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.StepTokens(ctx, smp.Next()); err == nil {
		t.Fatal("an iteration of 1 ms succeeded")
	}
	for i, ex := range execs[:2] {
		if err := ex.Err(); err != nil {
			t.Fatalf("executor %d after iterations that timed out: %v", i, err)
		}
	}
}
