package pipeline

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/text"
)

// PlanComparison is one strategy's plan for the session's profiled cluster,
// its predicted iteration time and, after MeasurePlans, its measured ones.
type PlanComparison struct {
	// Strategy is the allocation strategy's name.
	Strategy string
	// Err is the strategy's failure to plan; the other fields are then
	// empty.
	Err error
	// Plan is the strategy's plan (device indices as in Session.Problem).
	Plan alloc.Plan
	// SolveTime is the wall time of Session.Solve.
	SolveTime time.Duration
	// Prediction is the calibrated simulation of the session's schedule.
	Prediction Prediction
	// Report is alloc's analytic cost model of the plan.
	Report *alloc.Report
	// Times are the measured iteration times in seconds.
	Times []float64
}

// ComparePlans plans with every named strategy and predicts each plan's
// iteration time. A strategy that cannot plan is reported in its entry;
// the error is for failures to predict a plan and the context's end.
func (s *Session) ComparePlans(ctx context.Context, strategies []string) (PlanComparisons, error) {
	out := make(PlanComparisons, 0, len(strategies))
	for _, name := range strategies {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("pipeline: compare plans: %w", err)
		}
		pc := PlanComparison{Strategy: name}
		t0 := time.Now()
		plan, err := s.Solve(ctx, name)
		if err != nil {
			pc.Err = err
			out = append(out, pc)
			continue
		}
		pc.Plan, pc.SolveTime = plan, time.Since(t0)
		if pc.Prediction, err = s.Predict(plan); err != nil {
			return nil, err
		}
		if pc.Report, err = s.Report(plan); err != nil {
			return nil, err
		}
		out = append(out, pc)
	}
	return out, nil
}

// MeasureOptions configures MeasurePlans.
type MeasureOptions struct {
	// Data yields the batches of the measured iterations of an image
	// model; Tokens those of a language model.
	Data   *Batches
	Tokens *text.Sampler
	// Rounds is how many iterations of each plan are measured (at least 1).
	Rounds int
	// Warmup is how many unmeasured iterations run after every install of
	// a plan, before its measured one (0: one in the first round only, to
	// open the connections between neighbours). The first iteration after
	// a re-plan is slower than the plan's steady state: fresh layers,
	// optimizer state and buffers (up to 45% for bert-stack stages on
	// steady emulated devices).
	Warmup int
	// Calibrate, for MeasureStrategies, is how many iterations of the
	// session's current plan calibrate the cost model (Recalibrate, after
	// CalibrationWarmup unmeasured ones) before the strategies plan, so
	// that their predictions are calibrated ones (0: the profiles'
	// predictions).
	Calibrate int
	// OnIteration, when set, is called after every measured iteration with
	// the plan's strategy, the iteration's stats and how long installing
	// the plan took.
	OnIteration func(strategy string, st IterStats, setPlan time.Duration)
}

// MeasurePlans runs the plans of cmp that have one in turn, round after
// round, and appends each measured iteration time to its entry's Times.
// In the first round every plan runs one unmeasured iteration first, to
// open the connections between its neighbours, and with o.Warmup every
// install of a plan runs that many. The session is left on the last plan
// measured.
func (s *Session) MeasurePlans(ctx context.Context, cmp PlanComparisons, o MeasureOptions) error {
	if (o.Data == nil) == (o.Tokens == nil) || o.Rounds < 1 {
		return fmt.Errorf("pipeline: measure plans: need data (images or tokens) and at least one round, got %d", o.Rounds)
	}
	for round := 0; round < o.Rounds; round++ {
		for i := range cmp {
			pc := &cmp[i]
			if pc.Err != nil {
				continue
			}
			t0 := time.Now()
			if err := s.SetPlan(ctx, pc.Plan); err != nil {
				return fmt.Errorf("pipeline: install %s plan: %w", pc.Strategy, err)
			}
			set := time.Since(t0)
			steps := 1 + o.Warmup
			if round == 0 {
				steps = max(steps, 2)
			}
			var st IterStats
			for range steps {
				var err error
				if st, err = o.step(ctx, s); err != nil {
					return err
				}
			}
			pc.Times = append(pc.Times, st.Seconds)
			if o.OnIteration != nil {
				o.OnIteration(pc.Strategy, st, set)
			}
		}
	}
	return nil
}

// step trains one iteration on the next batch of o's data.
func (o MeasureOptions) step(ctx context.Context, s *Session) (IterStats, error) {
	if o.Tokens != nil {
		return s.StepTokens(ctx, o.Tokens.Next())
	}
	b, _ := o.Data.Next()
	return s.Step(ctx, b)
}

// CalibrationWarmup iterations of a fresh plan run before the ones that
// calibrate (MeasureOptions.Calibrate): the first iterations of fresh
// workers are up to 1.7× slower (heaps and buffers growing).
const CalibrationWarmup = 2

// calibrate runs o.Calibrate iterations of the current plan after
// CalibrationWarmup unmeasured ones and recalibrates on them.
func (o MeasureOptions) calibrate(ctx context.Context, s *Session) error {
	var calib []IterStats
	for i := range CalibrationWarmup + o.Calibrate {
		st, err := o.step(ctx, s)
		if err != nil {
			return fmt.Errorf("pipeline: calibration iteration: %w", err)
		}
		if i >= CalibrationWarmup {
			calib = append(calib, st)
		}
	}
	return s.Recalibrate(calib)
}

// PlanComparisons are the entries of ComparePlans, in the order asked.
type PlanComparisons []PlanComparison

// Get returns the entry of the named strategy.
func (cmp PlanComparisons) Get(strategy string) (PlanComparison, bool) {
	if i := cmp.index(strategy); i >= 0 {
		return cmp[i], true
	}
	return PlanComparison{}, false
}

// index is the position of the named strategy's entry, or -1.
func (cmp PlanComparisons) index(strategy string) int {
	return slices.IndexFunc(cmp, func(pc PlanComparison) bool { return pc.Strategy == strategy })
}
