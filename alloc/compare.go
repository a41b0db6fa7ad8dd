package alloc

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// BaselineStrategy is the strategy every comparison measures against.
const BaselineStrategy = "even"

// Comparison is one strategy's outcome in a Compare run.
type Comparison struct {
	// Strategy is the strategy's registry name.
	Strategy string
	// Result is the strategy's plan and predicted cost; nil when Err is set.
	Result *Result
	// Err is the strategy's failure (errors wrapping ErrInfeasible, such as
	// a *MemoryError, mean the cluster cannot hold the model).
	Err error
	// BaselineOnly marks the even entry that Compare adds when the
	// strategies asked for do not include even.
	BaselineOnly bool
	// SpeedupOnEven is even's predicted value over this strategy's (above 1:
	// faster than even); 0 if either failed or predicts no time.
	SpeedupOnEven float64
}

// Comparisons are the outcomes of a Compare run: the baseline first if it
// was added, then the strategies in the order asked.
type Comparisons []Comparison

// Baseline returns the even entry, which Compare always includes.
func (cs Comparisons) Baseline() Comparison {
	i := slices.IndexFunc(cs, func(c Comparison) bool { return c.Strategy == BaselineStrategy })
	if i < 0 {
		return Comparison{Strategy: BaselineStrategy, Err: fmt.Errorf("alloc: no %s baseline in the comparison", BaselineStrategy)}
	}
	return cs[i]
}

// Asked returns the entries of the strategies asked for, without an added
// baseline.
func (cs Comparisons) Asked() Comparisons {
	return slices.DeleteFunc(slices.Clone(cs), func(c Comparison) bool { return c.BaselineOnly })
}

// Get returns the entry of the named strategy.
func (cs Comparisons) Get(name string) (Comparison, bool) {
	i := slices.IndexFunc(cs, func(c Comparison) bool { return c.Strategy == name })
	if i < 0 {
		return Comparison{}, false
	}
	return cs[i], true
}

// CompareOptions tunes Compare.
type CompareOptions struct {
	// TimeLimit bounds each strategy's solve through its context (0: no
	// bound beyond the caller's context).
	TimeLimit time.Duration
}

// Compare solves p with every strategy and with the even baseline (run once
// even if not asked for), and rates each plan against even's. A strategy's
// failure is reported in its entry; the returned error is only the
// context's, when it ends before all strategies ran.
func Compare(ctx context.Context, p Problem, strategies []Strategy, opts CompareOptions) (Comparisons, error) {
	solve := func(s Strategy) Comparison {
		sctx, cancel := ctx, context.CancelFunc(func() {})
		if opts.TimeLimit > 0 {
			sctx, cancel = context.WithTimeout(ctx, opts.TimeLimit)
		}
		defer cancel()
		r, err := s.Solve(sctx, p)
		return Comparison{Strategy: s.Name(), Result: r, Err: err}
	}
	var out Comparisons
	for _, s := range strategies {
		out = append(out, solve(s))
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("alloc: compare: %w", err)
		}
	}
	if _, ok := out.Get(BaselineStrategy); !ok {
		base := solve(Even{})
		base.BaselineOnly = true
		out = append(Comparisons{base}, out...)
	}
	base := out.Baseline()
	for i := range out {
		out[i].SpeedupOnEven = speedup(base, out[i])
	}
	return out, nil
}

// speedup is base's predicted value over c's, or 0 if either is missing.
func speedup(base, c Comparison) float64 {
	if base.Err != nil || base.Result == nil || c.Err != nil || c.Result == nil || !(c.Result.Predicted > 0) {
		return 0
	}
	return base.Result.Predicted / c.Result.Predicted
}

// Strategies returns the named strategies with their default options,
// except that optimal gets optimalLimit as its time limit when positive.
func Strategies(names []string, optimalLimit time.Duration) ([]Strategy, error) {
	var out []Strategy
	for _, n := range names {
		s, err := NewStrategy(n)
		if err != nil {
			return nil, err
		}
		if _, ok := s.(Optimal); ok && optimalLimit > 0 {
			s = Optimal{TimeLimit: optimalLimit}
		}
		out = append(out, s)
	}
	return out, nil
}
