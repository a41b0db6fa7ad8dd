package pipeline

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/stats"
)

// FailureDrill returns a TrainOptions.BeforeStep hook that kills local
// worker wWorker (KillWorker) before iteration at, once, and says so on
// log; nil if the scenario has no local workers or worker is negative.
func (sc *Scenario) FailureDrill(worker, at int, log io.Writer) func(context.Context, int) error {
	if sc.LocalWorkers() == 0 || worker < 0 {
		return nil
	}
	return func(_ context.Context, iter int) error {
		if worker < 0 || iter != at {
			return nil
		}
		fmt.Fprintf(log, "failure drill: killing worker w%d before iteration %d\n", worker, iter)
		w := worker
		worker = -1
		return sc.KillWorker(w)
	}
}

// PlanMeasurement is one strategy's plan as MeasureStrategies measured
// it.
type PlanMeasurement struct {
	Strategy  string     `json:"strategy"`
	Plan      alloc.Plan `json:"plan"`
	Predicted float64    `json:"predicted_seconds"`
	Median    float64    `json:"measured_seconds"` // median iteration time
	Times     []float64  `json:"times"`
}

// MeasureStrategies calibrates the cost model on the current plan
// (m.Calibrate), plans with each of strategies, runs each plan for
// m.Rounds iterations in turn (real training steps, on m's data), then
// leaves the session on then's plan (Compare). It prints each
// measurement, and each strategy that cannot plan, on log; those are left
// out of the result.
func (s *Session) MeasureStrategies(ctx context.Context, strategies []string, then string, m MeasureOptions, log io.Writer) ([]PlanMeasurement, error) {
	if m.Calibrate > 0 {
		fmt.Fprintf(log, "calibrating the cost model on %d iterations of the current plan\n", m.Calibrate)
		if err := m.calibrate(ctx, s); err != nil {
			return nil, err
		}
	}
	cmp, err := s.Compare(ctx, CompareOptions{
		Strategies: strategies,
		Planned: func(PlanComparisons) error {
			fmt.Fprintf(log, "comparing plans of %s: %d measured iterations each, in turn\n", strings.Join(strategies, ","), m.Rounds)
			return nil
		},
		Measurement: m,
		Then:        then,
	})
	if err != nil {
		return nil, err
	}
	var res []PlanMeasurement
	for _, pc := range cmp {
		if pc.Err != nil {
			fmt.Fprintf(log, "  %-8s cannot plan: %v\n", pc.Strategy, pc.Err)
			continue
		}
		pm := PlanMeasurement{Strategy: pc.Strategy, Plan: pc.Plan, Predicted: pc.Prediction.Iteration, Median: stats.Median(pc.Times), Times: pc.Times}
		fmt.Fprintf(log, "  %-8s measured %.1f ms/iteration (median of %d), predicted %.1f ms\n", pm.Strategy, 1e3*pm.Median, len(pm.Times), 1e3*pm.Predicted)
		res = append(res, pm)
	}
	return res, nil
}
