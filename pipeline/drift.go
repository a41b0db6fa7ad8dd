package pipeline

import "math"

// Drift detection constants: the first iteration after a setup warms up and
// is not observed; the smoothed speed after driftBaselineIter iterations is
// a stage's baseline; driftSmoothing weighs a new measurement against the
// running average.
const (
	driftWarmupIters  = 1
	driftBaselineIter = 3
	driftSmoothing    = 0.5
)

// driftDetector decides, from the speeds measured on every stage of the
// running plan, when the plan should be redone. It is a plain value with no
// clock, network or coordinator: the session feeds it one observation per
// committed iteration and resets it whenever it installs or confirms a plan.
//
// A stage's baseline is its smoothed speed in the first iterations of the
// plan (with its layers and its neighbours), and drift is a change of the
// smoothed speed relative to that baseline by more than threshold for
// patience observations in a row. Comparing a stage with itself, rather
// than with the profiled speed, is robust to the different efficiency of
// different layers.
type driftDetector struct {
	threshold float64 // relative change that counts as drift; ≤ 0 disables
	patience  int     // consecutive drifting observations that trigger
	iters     int     // iterations observed since the last reset
	stages    []stageDrift
}

// stageDrift is one stage's history.
type stageDrift struct {
	planned  float64 // the worker's speed the plan assumed
	ema      float64 // smoothed measured speed; 0 until measured
	baseline float64 // ema early in the plan; 0 until known
	count    int     // consecutive observations off by more than the threshold
}

// drift is a detected drift.
type drift struct {
	// stage is the first stage that drifted and ratio its smoothed speed
	// relative to its baseline.
	stage int
	ratio float64
	// speeds is every stage's planning speed scaled by its measured
	// change, the speeds to plan the next time with; 0 for a stage whose
	// baseline is not known yet.
	speeds []float64
}

// newDriftDetector returns a detector for stages planned with the given
// speeds. patience < 1 counts as 1.
func newDriftDetector(threshold float64, patience int, planned []float64) driftDetector {
	d := driftDetector{threshold: threshold, patience: max(patience, 1)}
	d.reset(planned)
	return d
}

// reset starts over for stages planned with the given speeds.
func (d *driftDetector) reset(planned []float64) {
	d.iters = 0
	d.stages = make([]stageDrift, len(planned))
	for k, p := range planned {
		d.stages[k].planned = p
	}
}

// observe records one committed iteration's measured speed per stage (a
// value ≤ 0 or NaN means not measured) and reports whether the plan has
// drifted. speeds must have one entry per stage.
func (d *driftDetector) observe(speeds []float64) (drift, bool) {
	d.iters++
	if d.iters <= driftWarmupIters || d.threshold <= 0 {
		return drift{}, false
	}
	out := drift{stage: -1}
	for k := range d.stages {
		a := &d.stages[k]
		sp := speeds[k]
		if !(sp > 0) {
			continue
		}
		if a.ema == 0 {
			a.ema = sp
		} else {
			a.ema = (1-driftSmoothing)*a.ema + driftSmoothing*sp
		}
		if a.baseline == 0 {
			if d.iters >= driftBaselineIter {
				a.baseline = a.ema
			}
			continue
		}
		if math.Abs(a.ema/a.baseline-1) > d.threshold {
			a.count++
		} else {
			a.count = 0
		}
		if a.count >= d.patience && out.stage < 0 {
			out.stage, out.ratio = k, a.ema/a.baseline
		}
	}
	if out.stage < 0 {
		return drift{}, false
	}
	out.speeds = make([]float64, len(d.stages))
	for k, a := range d.stages {
		if a.baseline > 0 {
			out.speeds[k] = a.planned * a.ema / a.baseline
		}
	}
	return out, true
}
