package pipeline

import (
	"slices"
	"testing"
	"time"

	"github.com/skyhive/skyhive/alloc"
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

// TestRecalibrateOnInterleavedRounds measures two plans in turn with a
// warm-up after every switch, then calibrates on the even plan's rounds,
// which are no longer the running plan: Recalibrate refuses them,
// RecalibrateOn takes them for the even plan and refuses them for the
// other one.
func TestRecalibrateOnInterleavedRounds(t *testing.T) {
	ctx, s := smallSession(t, 1e-3, 1, 4)
	cmp, err := s.ComparePlans(ctx, []string{"even"})
	if err != nil || cmp[0].Err != nil {
		t.Fatal(err, cmp)
	}
	even := cmp[0].Plan
	if len(even.Stages) != 2 {
		t.Fatalf("even plan %+v, want 2 stages", even)
	}
	swapped := alloc.Plan{Stages: slices.Clone(even.Stages)}
	swapped.Stages[0].Device, swapped.Stages[1].Device = even.Stages[1].Device, even.Stages[0].Device
	cmp = append(cmp, PlanComparison{Strategy: "swapped", Plan: swapped})
	l, err := data.NewLoader(blobs(t, 128, 5), data.BatchOptions{Size: 32, Shuffle: true, Seed: 5, DropLast: true})
	if err != nil {
		t.Fatal(err)
	}
	var evenIters []IterStats
	err = s.MeasurePlans(ctx, cmp, MeasureOptions{Data: NewBatches(l), Rounds: 2, Warmup: 1,
		OnIteration: func(strategy string, st IterStats, _ time.Duration) {
			if strategy == "even" {
				evenIters = append(evenIters, st)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	// Two plans, two rounds, a warm-up after every install.
	if len(evenIters) != 2 || s.Iter() != 8 {
		t.Fatalf("%d even iterations measured, %d run; want 2 of 8", len(evenIters), s.Iter())
	}
	if err := s.Recalibrate(evenIters); err == nil {
		t.Error("Recalibrate took iterations of a plan that is not running")
	}
	if err := s.RecalibrateOn(swapped, evenIters); err == nil {
		t.Error("RecalibrateOn took the even plan's iterations for another plan")
	}
	if err := s.RecalibrateOn(even, evenIters); err != nil {
		t.Fatal(err)
	}
	if p, err := s.Predict(even); err != nil || !(p.Iteration > 0) {
		t.Errorf("prediction after the interleaved calibration: %+v, %v", p, err)
	}
}
