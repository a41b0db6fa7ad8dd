package pipeline

import (
	"context"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/launch"
)

// envAsWorker makes the test binary act as `skyhive worker`, so that the
// scenario's test starts real worker processes without building the
// skyhive binary.
const envAsWorker = "SKYHIVE_PIPELINE_TEST_WORKER"

// workerMain serves as a launched pipeline worker (the test binary stands
// in for skyhive, started as "BINARY @FILE"), until the coordinator shuts
// it down or SIGTERM arrives.
func workerMain(args []string) int {
	path, ok := launch.FileArg(args)
	if !ok {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := RunWorkerFile(ctx, path); err != nil && ctx.Err() == nil {
		return 1
	}
	return 0
}

// A scenario launches worker processes, compares and measures plans,
// leaves the session on the plan asked for, trains on it, survives a
// killed worker, and Close ends everything it started.
func TestScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sc, err := StartScenario(ctx, ScenarioConfig{
		Binary: exe, Slowdowns: []float64{1, 3, 1}, Env: []string{envAsWorker + "=1", "GOMAXPROCS=1"},
		Worker: launch.Worker{Steady: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if n := sc.LocalWorkers(); n != 3 {
		t.Fatalf("%d local workers, want 3", n)
	}
	if err := sc.Launch(ctx); err == nil {
		t.Error("a second Launch started more workers")
	}
	s, err := sc.Start(ctx, SessionConfig{Model: "deep-mlp:32x6", Seed: 1, Batch: 16, Micro: 2, Schedule: OneFOneB,
		Optim: OptimConfig{LR: 1e-3}, Strategy: "even", ProfileReps: 1})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := data.GaussianBlobs(16*4, InputFeatures, data.NumClasses, 1)
	if err != nil {
		t.Fatal(err)
	}
	loader, err := data.NewLoader(ds, data.BatchOptions{Size: 16, Shuffle: true, Seed: 1, DropLast: true})
	if err != nil {
		t.Fatal(err)
	}
	batches := NewBatches(loader)
	var planned PlanComparisons
	var measured []string
	cmp, err := s.Compare(ctx, CompareOptions{
		Strategies:  []string{"even", "no-such-strategy", "sky", "skyhive"},
		Measure:     []string{"skyhive", "even"},
		Planned:     func(cmp PlanComparisons) error { planned = cmp; return nil },
		Measurement: MeasureOptions{Data: batches, Rounds: 2, OnIteration: func(name string, _ IterStats, _ time.Duration) { measured = append(measured, name) }},
		Then:        "sky",
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(planned) != 4 || len(cmp) != 4 {
		t.Fatalf("planned %d, compared %d entries, want 4", len(planned), len(cmp))
	}
	for _, pc := range cmp {
		want := 0
		switch pc.Strategy {
		case "no-such-strategy":
			if pc.Err == nil {
				t.Error("an unknown strategy planned")
			}
			continue
		case "even", "skyhive":
			want = 2
		}
		if pc.Err != nil || len(pc.Plan.Stages) == 0 || !(pc.Prediction.Iteration > 0) || len(pc.Times) != want {
			t.Errorf("%s: err %v, plan %v, prediction %v, times %v (want %d)", pc.Strategy, pc.Err, pc.Plan, pc.Prediction.Iteration, pc.Times, want)
		}
	}
	if !slices.Equal(measured, []string{"skyhive", "even", "skyhive", "even"}) {
		t.Errorf("measured %v, want skyhive and even in turn", measured)
	}
	sky, _ := cmp.Get("sky")
	if !slices.Equal(s.Plan().Stages, sky.Plan.Stages) {
		t.Errorf("session on plan %v, want sky's %v", s.Plan().Stages, sky.Plan.Stages)
	}
	first := s.Iter()
	tr, err := s.Train(ctx, TrainOptions{Data: batches, Steps: first + 3, Eval: ds,
		BeforeStep: func(_ context.Context, iter int) error {
			if iter == first+1 {
				return sc.KillWorker(1)
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Ran != 3 || len(tr.Events) == 0 || !(tr.TestAccuracy >= 0) {
		t.Errorf("trained %+v: want 3 iterations and a recovery from the killed worker", tr)
	}
	if err := sc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sc.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := sc.Start(ctx, SessionConfig{Model: "deep-mlp:32x6"}); err == nil {
		t.Error("a closed scenario started a session")
	}
}
