package alloc

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
)

// stubStrategy fails with err, or answers with a copy of even's result
// scaled to predict factor times even's value.
type stubStrategy struct {
	name   string
	err    error
	factor float64
	// sawDeadline records whether Solve's context had a deadline.
	sawDeadline *bool
}

func (s stubStrategy) Name() string { return s.name }

func (s stubStrategy) Solve(ctx context.Context, p Problem) (*Result, error) {
	if s.sawDeadline != nil {
		_, *s.sawDeadline = ctx.Deadline()
	}
	if s.err != nil {
		return nil, s.err
	}
	r, err := Even{}.Solve(ctx, p)
	if err != nil {
		return nil, err
	}
	r.Strategy = s.name
	r.Predicted *= s.factor
	return r, nil
}

func names(cs Comparisons) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Strategy)
	}
	return out
}

func TestCompareRatiosAgainstEven(t *testing.T) {
	p := randomProblem(3, 6, 30, 2, true)
	cmp, err := Compare(context.Background(), p, []Strategy{Sky{}, Skyhive{}, stubStrategy{name: "half", factor: 0.5}}, CompareOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(cmp); len(got) != 4 || got[0] != "even" || got[1] != "sky" || got[2] != "skyhive" || got[3] != "half" {
		t.Fatalf("order %v, want the added baseline first, then the strategies as asked", got)
	}
	base := cmp.Baseline()
	if !base.BaselineOnly || base.Err != nil || base.SpeedupOnEven != 1 {
		t.Fatalf("baseline %+v: want an added, successful even with speedup 1", base)
	}
	if len(cmp.Asked()) != 3 {
		t.Errorf("Asked has %d entries, want 3", len(cmp.Asked()))
	}
	for _, c := range cmp[1:] {
		if c.Err != nil {
			t.Fatalf("%s: %v", c.Strategy, c.Err)
		}
		want := base.Result.Predicted / c.Result.Predicted
		if math.Abs(c.SpeedupOnEven-want) > 1e-12*want {
			t.Errorf("%s: speedup %v, want %v", c.Strategy, c.SpeedupOnEven, want)
		}
	}
	if h, _ := cmp.Get("half"); math.Abs(h.SpeedupOnEven-2) > 1e-12 {
		t.Errorf("a strategy predicting half of even's time: speedup %v, want 2", h.SpeedupOnEven)
	}
	if sh, _ := cmp.Get("skyhive"); sh.SpeedupOnEven < 1-1e-9 {
		t.Errorf("skyhive slower than even: %v", sh.SpeedupOnEven)
	}
}

func TestCompareKeepsAskedEvenAndOrder(t *testing.T) {
	p := randomProblem(4, 4, 12, 1, false)
	cmp, err := Compare(context.Background(), p, []Strategy{Skyhive{}, Even{}, Sky{}}, CompareOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(cmp); len(got) != 3 || got[0] != "skyhive" || got[1] != "even" || got[2] != "sky" {
		t.Fatalf("order %v, want skyhive, even, sky", got)
	}
	if cmp.Baseline().BaselineOnly {
		t.Error("even was asked for, yet marked baseline-only")
	}
}

func TestCompareReportsInfeasibleStrategy(t *testing.T) {
	p := randomProblem(5, 4, 12, 1, false)
	bad := stubStrategy{name: "bad", err: &MemoryError{Need: 10, Have: 5, Missing: 5, Detail: "stub"}}
	cmp, err := Compare(context.Background(), p, []Strategy{bad, Skyhive{}}, CompareOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, ok := cmp.Get("bad")
	if !ok || !errors.Is(b.Err, ErrInfeasible) || b.Result != nil || b.SpeedupOnEven != 0 {
		t.Fatalf("bad: %+v, want an infeasible entry without a speedup", b)
	}
	if sh, _ := cmp.Get("skyhive"); sh.Err != nil || sh.SpeedupOnEven <= 0 {
		t.Errorf("skyhive after a failing strategy: %+v", sh)
	}
}

func TestCompareClusterTooSmall(t *testing.T) {
	p := randomProblem(6, 4, 12, 1, false)
	for i := range p.Cluster.Devices {
		p.Cluster.Devices[i].MemBytes /= 10
	}
	cmp, err := Compare(context.Background(), p, []Strategy{Skyhive{}}, CompareOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var me *MemoryError
	if base := cmp.Baseline(); !errors.As(base.Err, &me) || me.Missing <= 0 {
		t.Errorf("even on a cluster too small: %v, want a MemoryError", base.Err)
	}
	for _, c := range cmp {
		if c.Err == nil || c.SpeedupOnEven != 0 {
			t.Errorf("%s: %+v, want a failure without a speedup", c.Strategy, c)
		}
	}
}

func TestCompareTimeLimitAndCancel(t *testing.T) {
	p := randomProblem(7, 3, 9, 1, false)
	var deadline bool
	if _, err := Compare(context.Background(), p, []Strategy{stubStrategy{name: "s", factor: 1, sawDeadline: &deadline}}, CompareOptions{TimeLimit: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if !deadline {
		t.Error("TimeLimit did not reach the strategy's context")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Compare(ctx, p, []Strategy{Even{}}, CompareOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want context.Canceled", err)
	}
}

func TestStrategiesOptimalLimit(t *testing.T) {
	ss, err := Strategies([]string{"even", "optimal"}, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := ss[1].(Optimal); !ok || o.TimeLimit != 3*time.Second {
		t.Errorf("optimal: %#v, want a 3s time limit", ss[1])
	}
	if _, err := Strategies([]string{"nope"}, 0); err == nil {
		t.Error("unknown strategy accepted")
	}
}
