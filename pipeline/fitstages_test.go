package pipeline

import (
	"math"
	"testing"
)

// TestFitStagesRecoversTheModel builds stage measurements from a known
// model (profiled layer times off by a common factor, a busy time per op,
// device factors, a wake-up delay per op) and checks that fitStages gets
// them back.
func TestFitStagesRecoversTheModel(t *testing.T) {
	const (
		scale    = 1.3
		opBusy   = 5e-4
		overhead = 8e-4
	)
	profiled := []float64{0.002, 0.040, 0.041, 0.039, 0.0005}
	factors := []float64{35, 7.8, 19, 10, 28}
	var obs []stageObs
	for i, p := range profiled {
		ops := 32.0
		cpu := scale*p + opBusy*ops
		obs = append(obs, stageObs{Ops: ops, Profiled: p, CPU: cpu, Compute: cpu*factors[i] + overhead*ops})
	}
	fit, err := fitStages(obs, overhead)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(fit.OpBusy-opBusy) > 1e-9 || math.Abs(fit.Scale-scale) > 1e-6 {
		t.Fatalf("fit per-op %.6g scale %.6g, want %.6g and %.6g", fit.OpBusy, fit.Scale, opBusy, scale)
	}
	for i := range obs {
		if math.Abs(fit.Factors[i]-factors[i]) > 1e-6 {
			t.Fatalf("stage %d: factor %.6g, want %.6g", i, fit.Factors[i], factors[i])
		}
	}
	// The fitted model reproduces every stage's busy and compute time.
	for i, o := range obs {
		cpu := fit.Scale*o.Profiled + fit.OpBusy*o.Ops
		if math.Abs(cpu-o.CPU) > 1e-9 || math.Abs(cpu*fit.Factors[i]+overhead*o.Ops-o.Compute) > 1e-9 {
			t.Fatalf("stage %d not reproduced", i)
		}
	}
}

// TestFitStagesChargesExtraBusyToTheWorker checks that a stage busier
// than the fitted costs of its layers (a worker that finds colder caches)
// has the excess in its worker's factor, so that its layers cost as much
// on the next worker that holds them.
func TestFitStagesChargesExtraBusyToTheWorker(t *testing.T) {
	var obs []stageObs
	for i := range 5 {
		cpu := 0.04 * []float64{1, 1, 1.3, 1, 1}[i] // stage 2's worker 30% busier
		obs = append(obs, stageObs{Ops: 32, Profiled: 0.04, CPU: cpu, Compute: 10 * cpu})
	}
	fit, err := fitStages(obs, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fit.Factors[2] < 1.2*fit.Factors[0] {
		t.Fatalf("factors %v: the busier worker's is not ≥1.2× the others'", fit.Factors)
	}
	for i, f := range fit.Factors {
		if busy := fit.Scale*obs[i].Profiled + fit.OpBusy*obs[i].Ops; math.Abs(f*busy-obs[i].Compute) > 1e-12 {
			t.Fatalf("stage %d: factor × fitted busy %g, compute %g", i, f*busy, obs[i].Compute)
		}
	}
}

// TestFitStagesBounds checks the fit's guards: a per-op time that would
// be negative is 0, one stage alone gives no per-op time, and bad
// measurements are refused.
func TestFitStagesBounds(t *testing.T) {
	// Light stages measured faster per profiled second than heavy ones:
	// the unconstrained fit would make the per-op time negative.
	obs := []stageObs{
		{Ops: 32, Profiled: 0.002, CPU: 0.001, Compute: 0.03},
		{Ops: 32, Profiled: 0.040, CPU: 0.060, Compute: 0.6},
	}
	fit, err := fitStages(obs, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fit.OpBusy != 0 {
		t.Fatalf("per-op time %g, want 0", fit.OpBusy)
	}
	for i, o := range obs {
		if want := o.Compute / (fit.Scale * o.Profiled); math.Abs(fit.Factors[i]-want) > 1e-9 {
			t.Fatalf("stage %d factor %g, want %g", i, fit.Factors[i], want)
		}
	}
	one, err := fitStages(obs[1:], 0)
	if err != nil || one.OpBusy != 0 || math.Abs(one.Scale-1.5) > 1e-9 {
		t.Fatalf("one stage: %+v, %v", one, err)
	}
	for _, bad := range [][]stageObs{nil, {{Ops: 0, Profiled: 1, CPU: 1, Compute: 1}}, {{Ops: 1, Profiled: 1, CPU: math.NaN(), Compute: 1}}} {
		if _, err := fitStages(bad, 0); err == nil {
			t.Fatalf("%+v: no error", bad)
		}
	}
}
