package experiment

import (
	"math"
	"strings"
	"testing"
)

// skyTestPoint is a grid point whose strategies were measured at the
// given measured/predicted ratios (even first) with skyhive's measured
// speed-up over even.
func skyTestPoint(workers, layers int, speedup float64, ratios ...float64) skyPoint {
	pt := skyPoint{Name: skyPointName(workers, layers), Workers: workers, Layers: layers}
	for i, s := range skyStrategies {
		r := skyStrategyResult{Strategy: s, Median: 2, Predicted: 2 / ratios[i], MeasuredOverPredicted: ratios[i], SpeedupOnEven: 1, PredictedSpeedup: 1}
		if s == "skyhive" {
			r.SpeedupOnEven, r.PredictedSpeedup = speedup, speedup
		}
		pt.Results = append(pt.Results, r)
	}
	return pt
}

// TestSkyTargets: the speed-up is judged at the largest point (the most
// workers among points of equal size), and every cell must be within 15%
// (0.85 and 1.15 are), a strategy that could not plan counting as outside.
func TestSkyTargets(t *testing.T) {
	points := []skyPoint{
		skyTestPoint(16, 48, 1.45, 1, 1.15, 0.85, 1.02),
		skyTestPoint(8, 96, 1.2, 1, 1, 1, 1), // as large, fewer workers
		skyTestPoint(4, 8, 2, 0.95, 1.05, 1.1, 0.9),
	}
	ts := skyTargets(points)
	if len(ts) != 2 {
		t.Fatalf("%d targets", len(ts))
	}
	sp, acc := ts[0], ts[1]
	if !sp.Evaluated || !sp.Met || sp.Values["measured"] != 1.45 || sp.Values["workers"] != 16 || !strings.Contains(sp.Note, "16x48") {
		t.Errorf("speed-up target %+v", sp)
	}
	if !acc.Evaluated || !acc.Met || acc.Values["cells"] != 12 || acc.Values["within"] != 12 || acc.Values["min"] != 0.85 || acc.Values["max"] != 1.15 {
		t.Errorf("accuracy target %+v", acc)
	}

	points[0] = skyTestPoint(16, 48, 1.39, 1, 1.16, 0.85, 1.02)
	points[2].Results[3] = skyStrategyResult{Strategy: "skyhive", Error: "cannot plan"}
	ts = skyTargets(points)
	sp, acc = ts[0], ts[1]
	if !sp.Evaluated || sp.Met {
		t.Errorf("speed-up 1.39 judged %+v", sp)
	}
	if !acc.Evaluated || acc.Met || acc.Values["within"] != 10 || !strings.Contains(acc.Note, "16x48 sky 1.16") || !strings.Contains(acc.Note, "4x8 skyhive unmeasured") {
		t.Errorf("accuracy target %+v", acc)
	}

	ts = skyTargets(nil)
	if ts[0].Evaluated || ts[1].Evaluated || ts[0].Met || ts[1].Met {
		t.Errorf("no points: %+v", ts)
	}
}

// TestSkyRepeatedTargets: with repetitions the targets are judged on the
// medians of every cell (a ratio's median, not the ratio of medians), and
// the note says in how many repetitions each held alone.
func TestSkyRepeatedTargets(t *testing.T) {
	var reps []skyRepeat
	for i, c := range []struct {
		sky, speedup float64
	}{{1.25, 1.3}, {1.05, 1.5}, {1.1, 1.6}} {
		pts := []skyPoint{skyTestPoint(16, 48, c.speedup, 1, c.sky, 1, 1)}
		pts[0].Results[1].Median = float64(i + 1)
		reps = append(reps, skyRepeat{Seed: uint64(i + 1), Points: pts, Targets: skyTargets(pts)})
	}
	med := skyMedianPoints(reps)
	if len(med) != 1 || len(med[0].Results) != len(skyStrategies) {
		t.Fatalf("medians %+v", med)
	}
	sky := med[0].Results[1]
	if sky.MeasuredOverPredicted != 1.1 || sky.Median != 2 || sky.Min != 1 || sky.Max != 3 || len(sky.Times) != 3 || len(sky.Plan.Stages) != 0 {
		t.Errorf("sky's medians %+v", sky)
	}
	ts := skyRepeatedTargets(reps)
	if !ts[0].Met || ts[0].Values["measured"] != 1.5 || !strings.HasPrefix(ts[0].Note, "met in 2 of 3 repetitions") {
		t.Errorf("speed-up over repetitions %+v", ts[0])
	}
	if !ts[1].Met || !strings.HasPrefix(ts[1].Note, "met in 2 of 3 repetitions") || !strings.Contains(ts[1].Claim, "median over the repetitions") {
		t.Errorf("accuracy over repetitions %+v", ts[1])
	}

	// A strategy that failed everywhere keeps an error, and is outside.
	for i := range reps {
		reps[i].Points[0].Results[2] = skyStrategyResult{Strategy: "optimal", Error: "solver"}
	}
	med = skyMedianPoints(reps)
	if e := med[0].Results[2].Error; !strings.Contains(e, "seed 1: solver") || !strings.Contains(e, "seed 3: solver") {
		t.Errorf("optimal's error %q", e)
	}
	if ts := skyRepeatedTargets(reps); ts[1].Met || math.IsNaN(ts[1].Values["min"]) {
		t.Errorf("accuracy with a failed strategy %+v", ts[1])
	}
}
