package experiment

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/skyhive/skyhive/data"
)

// raceEnabled is set under the race detector (race_test.go).
var raceEnabled bool

// TestMoEConvergenceQuick runs the quick variant end to end: the swarm,
// 64 trainers, evaluation and the result files. Each run has a fixed time
// budget, in which the race detector's 5-10x slowdown leaves too few
// samples to reach the accuracy checked, so it does not run under -race
// (moe/client's trainer tests cover the same code there).
func TestMoEConvergenceQuick(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("trains for about a minute")
	}
	if _, err := os.Stat(filepath.Join(data.DefaultDir, "train-images-idx3-ubyte.gz")); err != nil {
		if _, err2 := os.Stat(data.DefaultDir); err2 != nil {
			t.Skip("Fashion-MNIST not installed")
		}
	}
	out := t.TempDir()
	o := Options{Out: out, Quick: true, Seed: 1}
	if testing.Verbose() {
		o.Log = os.Stderr
	}
	if err := runMoEConvergence(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "moe-convergence.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Runs []moeRunResult `json:"runs"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	// Every run must learn (above chance, 10%), and the best must reach
	// 30%. Runs have a time budget: when other tests load the machine
	// (the swarm tests of cmd/skyhive run alongside in `make test`), the
	// slowest run, 10% failures at 100 ms, gets too few samples for 30%:
	// 2 944 samples and 15.7% once on 2026-11-24.
	// A run that the load left with fewer than minSamples (768 once on
	// 2026-11-26) is only required to have trained; the best run must
	// still reach 30%.
	const minSamples = 3000
	best := 0.0
	for _, r := range res.Runs {
		best = max(best, r.FinalAccuracy)
		switch {
		case r.Samples == 0:
			t.Errorf("%s: no samples trained", r.Name)
		case r.Samples < minSamples:
			t.Logf("%s: only %d samples under load, accuracy %.3f not checked", r.Name, r.Samples, r.FinalAccuracy)
		case r.FinalAccuracy < 0.12:
			t.Errorf("%s: %d samples, accuracy %.3f", r.Name, r.Samples, r.FinalAccuracy)
		}
	}
	if best < 0.3 {
		t.Errorf("best accuracy %.3f < 0.3: %+v", best, res.Runs)
	}
	if _, err := os.Stat(filepath.Join(out, "moe-convergence.png")); err != nil {
		t.Fatal(err)
	}
}
