package alloc

import (
	"context"
	"fmt"
	"time"
)

// Result is a strategy's answer.
type Result struct {
	// Strategy is the name of the strategy that produced the plan.
	Strategy string
	// Plan is the assignment of layers to devices.
	Plan Plan
	// Report is the plan's predicted cost under the full cost model.
	Report *Report
	// Predicted is Report's value for the problem's objective.
	Predicted float64
	// SolveTime is the wall time the strategy took.
	SolveTime time.Duration
	// Proven is set by exact strategies when Plan is optimal for their
	// model (for "optimal": the paper's bottleneck objective).
	Proven bool
	// LowerBound is a proven lower bound on the strategy's own objective
	// (0 if unknown); Gap = (objective − LowerBound)/objective.
	LowerBound, Gap float64
	// Notes explain anything unusual (e.g. memory over-subscription of the
	// even baseline).
	Notes []string
}

// Strategy computes a plan.
type Strategy interface {
	// Name is the registry name.
	Name() string
	// Solve computes a plan. Errors wrapping ErrInfeasible mean the
	// cluster cannot hold the model (see MemoryError).
	Solve(ctx context.Context, p Problem) (*Result, error)
}

// StrategyNames lists the registered strategies.
func StrategyNames() []string { return []string{"even", "sky", "sky-orig", "optimal", "skyhive"} }

// NewStrategy returns the strategy registered under name with its default
// options.
func NewStrategy(name string) (Strategy, error) {
	switch name {
	case "even":
		return Even{}, nil
	case "sky":
		return Sky{}, nil
	case "sky-orig":
		return Sky{Original: true}, nil
	case "optimal":
		return Optimal{}, nil
	case "skyhive":
		return Skyhive{}, nil
	}
	return nil, fmt.Errorf("alloc: unknown strategy %q (known: %v)", name, StrategyNames())
}

// Solve runs the named strategy.
func Solve(ctx context.Context, name string, p Problem) (*Result, error) {
	s, err := NewStrategy(name)
	if err != nil {
		return nil, err
	}
	return s.Solve(ctx, p)
}

// finish evaluates a plan and fills a Result.
func finish(name string, p Problem, plan Plan, start time.Time) (*Result, error) {
	rep, err := Evaluate(p.Cluster, p.Model, plan)
	if err != nil {
		return nil, fmt.Errorf("alloc: %s produced an invalid plan: %w", name, err)
	}
	return &Result{
		Strategy:  name,
		Plan:      plan,
		Report:    rep,
		Predicted: rep.Value(p.Objective),
		SolveTime: time.Since(start),
	}, nil
}

// planFromBounds turns partition indices bounds[0]=0 ≤ … ≤ bounds[k]=L over
// devices order[0..k-1] into a plan, dropping empty stages.
func planFromBounds(order []int, bounds []int) Plan {
	var p Plan
	for i, d := range order {
		if bounds[i+1] > bounds[i] {
			p.Stages = append(p.Stages, Stage{Device: d, First: bounds[i], Last: bounds[i+1]})
		}
	}
	return p
}
