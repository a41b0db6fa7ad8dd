package pipeline

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestDriftDetector(t *testing.T) {
	const nan = -1 // marks an unmeasured speed in the tables
	cases := []struct {
		name      string
		threshold float64
		patience  int
		planned   []float64
		// iters holds one row of measured speeds per iteration.
		iters [][]float64
		// at is the observation (0-based) that reports drift, −1 none.
		at        int
		stage     int
		ratio     float64
		newSpeeds []float64
	}{
		{
			name: "steady", threshold: 0.3, patience: 2, planned: []float64{10, 20},
			iters: [][]float64{{10, 20}, {10, 20}, {10, 20}, {10, 20}, {10, 20}, {10, 20}, {10, 20}},
			at:    -1,
		},
		{
			// Warm-up (0), first ema (1), baseline 10 (2); then the ema
			// goes 7.5 (3, off by 25%), 6.25 (4, 37.5%: count 1),
			// 5.625 (5, 43.75%: count 2 = patience).
			name: "slowdown after the baseline", threshold: 0.3, patience: 2, planned: []float64{100, 200},
			iters: [][]float64{{10, 20}, {10, 20}, {10, 20}, {5, 20}, {5, 20}, {5, 20}, {5, 20}},
			at:    5, stage: 0, ratio: 0.5625, newSpeeds: []float64{56.25, 200},
		},
		{
			name: "speed-up counts too", threshold: 0.3, patience: 1, planned: []float64{1},
			iters: [][]float64{{4}, {4}, {4}, {8}, {8}},
			at:    3, stage: 0, ratio: 1.5, newSpeeds: []float64{1.5},
		},
		{
			// One slow iteration moves the ema by half the difference;
			// the next normal one brings it back within the threshold.
			name: "a single spike is not drift", threshold: 0.3, patience: 2, planned: []float64{1},
			iters: [][]float64{{10}, {10}, {10}, {3}, {10}, {10}, {3}, {10}, {10}},
			at:    -1,
		},
		{
			name: "disabled", threshold: 0, patience: 1, planned: []float64{1},
			iters: [][]float64{{10}, {10}, {10}, {1}, {1}, {1}},
			at:    -1,
		},
		{
			// A wild first iteration (warming caches, connections) is not
			// observed, so it cannot skew the baseline.
			name: "warm-up ignored", threshold: 0.3, patience: 1, planned: []float64{1},
			iters: [][]float64{{1000}, {10}, {10}, {10}, {10}},
			at:    -1,
		},
		{
			// Stage 1 is never measured; stage 0 drifts. Only stages with
			// a baseline get a new speed.
			name: "unmeasured stage", threshold: 0.2, patience: 1, planned: []float64{3, 7},
			iters: [][]float64{{4, nan}, {4, nan}, {4, nan}, {2, nan}},
			at:    3, stage: 0, ratio: 0.75, newSpeeds: []float64{2.25, 0},
		},
		{
			// Both stages drift at once: the first is reported, both
			// rescaled.
			name: "first of several", threshold: 0.1, patience: 1, planned: []float64{1, 1},
			iters: [][]float64{{8, 8}, {8, 8}, {8, 8}, {4, 16}},
			at:    3, stage: 0, ratio: 0.75, newSpeeds: []float64{0.75, 1.5},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriftDetector(tc.threshold, tc.patience, tc.planned)
			got := -1
			for i, row := range tc.iters {
				speeds := make([]float64, len(row))
				for k, v := range row {
					speeds[k] = v
					if v == nan {
						speeds[k] = math.NaN()
					}
				}
				r, ok := d.observe(speeds)
				if !ok {
					continue
				}
				if got >= 0 {
					continue // keeps reporting while it lasts; the first counts
				}
				got = i
				if r.stage != tc.stage || math.Abs(r.ratio-tc.ratio) > 1e-12 {
					t.Errorf("observation %d: stage %d ratio %v, want stage %d ratio %v", i, r.stage, r.ratio, tc.stage, tc.ratio)
				}
				for k := range tc.newSpeeds {
					if math.Abs(r.speeds[k]-tc.newSpeeds[k]) > 1e-9 {
						t.Errorf("new speeds %v, want %v", r.speeds, tc.newSpeeds)
						break
					}
				}
			}
			if got != tc.at {
				t.Fatalf("drift reported at observation %d, want %d", got, tc.at)
			}
		})
	}
}

// TestDriftDetectorReset checks that a reset (a new or confirmed plan)
// forgets baselines and counts, and takes the new planning speeds.
func TestDriftDetectorReset(t *testing.T) {
	d := newDriftDetector(0.3, 1, []float64{1})
	for _, v := range []float64{10, 10, 10} {
		if _, ok := d.observe([]float64{v}); ok {
			t.Fatal("drift during the baseline")
		}
	}
	d.reset([]float64{2})
	// Without the reset, 5 against the baseline 10 would drift at once.
	for i, v := range []float64{5, 5, 5, 5, 5} {
		if r, ok := d.observe([]float64{v}); ok {
			t.Fatalf("observation %d after reset: drift %+v", i, r)
		}
	}
	if r, ok := d.observe([]float64{1}); !ok || r.speeds[0] != 2*0.6 {
		t.Fatalf("after a real slowdown: %+v %v, want new speed 1.2", r, ok)
	}
}

// TestDriftDetectorNoise feeds seeded noise of ±10% around a constant speed:
// with a 30% threshold there must be no drift, and a lasting halving of the
// speed must be detected within a few iterations.
func TestDriftDetectorNoise(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	d := newDriftDetector(0.3, 2, []float64{1, 1, 1})
	noisy := func(v float64) float64 { return v * (0.9 + 0.2*rng.Float64()) }
	for i := range 200 {
		if r, ok := d.observe([]float64{noisy(5), noisy(7), noisy(3)}); ok {
			t.Fatalf("iteration %d: drift %+v from noise alone", i, r)
		}
	}
	for range 6 {
		if r, ok := d.observe([]float64{noisy(5), noisy(3.5), noisy(3)}); ok {
			if r.stage != 1 {
				t.Fatalf("drift of stage %d, want 1", r.stage)
			}
			return
		}
	}
	t.Fatal("a halved stage speed went unnoticed")
}
