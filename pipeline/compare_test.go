package pipeline

import (
	"testing"
	"time"

	"github.com/skyhive/skyhive/data"
)

// TestComparePlans plans with two strategies and an unknown one, then
// measures the plans in turn.
func TestComparePlans(t *testing.T) {
	ctx, s := smallSession(t, 1e-3, 1, 2)
	cmp, err := s.ComparePlans(ctx, []string{"even", "nope", "skyhive"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cmp) != 3 || cmp[0].Strategy != "even" || cmp[1].Strategy != "nope" || cmp[2].Strategy != "skyhive" {
		t.Fatalf("entries %+v, want even, nope, skyhive in order", cmp)
	}
	if nope, _ := cmp.Get("nope"); nope.Err == nil {
		t.Error("an unknown strategy planned")
	}
	for _, name := range []string{"even", "skyhive"} {
		pc, ok := cmp.Get(name)
		if !ok || pc.Err != nil || len(pc.Plan.Stages) == 0 || !(pc.Prediction.Iteration > 0) || pc.Report == nil {
			t.Fatalf("%s: %+v", name, pc)
		}
	}
	l, err := data.NewLoader(blobs(t, 128, 5), data.BatchOptions{Size: 32, Shuffle: true, Seed: 5, DropLast: true})
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	err = s.MeasurePlans(ctx, cmp, MeasureOptions{Data: NewBatches(l), Rounds: 2,
		OnIteration: func(string, IterStats, time.Duration) { calls++ }})
	if err != nil {
		t.Fatal(err)
	}
	// Two plans, two rounds, one warm-up iteration each in the first.
	if calls != 4 || s.Iter() != 6 {
		t.Errorf("%d measured iterations of %d run; want 4 of 6", calls, s.Iter())
	}
	for _, pc := range cmp {
		if want := map[bool]int{true: 0, false: 2}[pc.Err != nil]; len(pc.Times) != want {
			t.Errorf("%s: %d times, want %d", pc.Strategy, len(pc.Times), want)
		}
	}
}
