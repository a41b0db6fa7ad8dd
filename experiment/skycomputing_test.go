package experiment

import (
	"context"
	"encoding/json"

	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/pipeline"
)

// envAsWorker makes the test binary act as `skyhive worker`, so that the
// experiment's test starts real worker processes without building the
// skyhive binary (package experiment cannot import the CLI).
const envAsWorker = "SKYHIVE_EXPERIMENT_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(envAsWorker) == "1" {
		os.Exit(workerMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

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
	if err := pipeline.RunWorkerFile(ctx, path); err != nil && ctx.Err() == nil {
		return 1
	}
	return 0
}

// TestSkyComputingTiny runs the experiment on a tiny grid (2 workers × 4
// layers, two rounds) over real worker processes and checks that every
// strategy has a plan, measured times, a prediction and speed-ups, that
// the extrapolation has every strategy too, and that the result files are
// written. It checks the form of the results, not their values.
func TestSkyComputingTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes and trains for a few seconds")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := skyConfig{
		Workers: []int{2}, Layers: []int{4}, Hidden: 32, MicroPerWorker: 1, MicroSize: 4, Base: 2, MaxSlowdown: 6,
		Rounds: 2, ProfileReps: 2, PointTimeout: time.Minute,
		ExtraWorkers: 8, ExtraLayers: 12, OptimalLimit: time.Second,
		Binary: exe, Env: []string{envAsWorker + "=1", "GOMAXPROCS=1"}, Worker: launch.Worker{Steady: true},
	}
	out := t.TempDir()
	o := Options{Out: out, Seed: 1}
	if testing.Verbose() {
		o.Log = os.Stderr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := skyRun(ctx, o, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := skyWrite(o, cfg, res); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "sky-computing.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got skyResults
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Points) != 1 || got.Points[0].Name != "2x4" || len(got.Points[0].Slowdowns) != 2 {
		t.Fatalf("points %+v", got.Points)
	}
	for _, u := range got.Points[0].Slowdowns {
		if u < 1 || u > 6 {
			t.Errorf("slowdown %v outside [1, 6]", u)
		}
	}
	check := func(where string, rs []skyStrategyResult, measured bool) {
		if len(rs) != len(skyStrategies) {
			t.Fatalf("%s: %d results, want %d", where, len(rs), len(skyStrategies))
		}
		for i, r := range rs {
			if r.Strategy != skyStrategies[i] || r.Error != "" {
				t.Errorf("%s: result %d is %q, error %q", where, i, r.Strategy, r.Error)
				continue
			}
			if r.Stages < 1 || len(r.Plan.Stages) != r.Stages || !(r.Predicted > 0) || !(r.Alloc > 0) || !(r.PredictedSpeedup > 0) {
				t.Errorf("%s %s: %+v", where, r.Strategy, r)
			}
			if !measured {
				continue
			}
			if len(r.Times) != cfg.Rounds || !(r.Min > 0) || r.Min > r.Median || r.Median > r.Max ||
				!(r.MeasuredOverPredicted > 0) || !(r.SpeedupOnEven > 0) || !(r.Interleaved > 0) || !(r.MeasuredOverInterleaved > 0) {
				t.Errorf("%s %s: measurements %+v", where, r.Strategy, r)
			}
		}
		if even := rs[0]; even.SpeedupOnEven != 0 && even.SpeedupOnEven != 1 {
			t.Errorf("%s: even's speed-up over itself is %v", where, even.SpeedupOnEven)
		}
	}
	check("2x4", got.Points[0].Results, true)
	if len(got.Targets) != 2 || !got.Targets[0].Evaluated || !got.Targets[1].Evaluated || got.Targets[1].Values["cells"] != float64(len(skyStrategies)) {
		t.Errorf("targets %+v", got.Targets)
	}
	ex := got.Extrapolation
	if ex == nil || ex.Model != "bert-large:12" || ex.Workers != 8 || len(ex.Slowdowns) != 8 || !(ex.Speed > 0) {
		t.Fatalf("extrapolation %+v", ex)
	}
	check("extrapolation", ex.Results, false)
	for _, f := range []string{"sky-computing.png", "sky-computing-times.png"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}
