package pipeline

import (
	"testing"
	"time"
)

// TestSteadyCostsMedian checks that an op's steady busy time is the
// median of its recent executions, kept apart per op and window-bounded.
func TestSteadyCostsMedian(t *testing.T) {
	var s steadyCosts
	a := stageWork{model: "m", first: 0, last: 4, input: true}
	fwd, bwd := opKey{work: a, n: 4}, opKey{work: a, backward: true, n: 4}
	ms := time.Millisecond
	for i, c := range []struct {
		k    opKey
		busy time.Duration
		want time.Duration
	}{
		{fwd, 10 * ms, 10 * ms},
		{fwd, 30 * ms, 30 * ms}, // median of two: the upper
		{fwd, 11 * ms, 11 * ms},
		{bwd, 50 * ms, 50 * ms}, // its own history
		{fwd, 100 * ms, 30 * ms},
		{fwd, 12 * ms, 12 * ms},
	} {
		if got := s.observe(c.k, c.busy); got != c.want {
			t.Errorf("step %d: %v, want %v", i, got, c.want)
		}
	}
	// A spike among steady executions does not move it.
	for range steadyWindow {
		s.observe(fwd, 20*ms)
	}
	if got := s.observe(fwd, 80*ms); got != 20*ms {
		t.Errorf("spike after a full window of 20 ms: %v", got)
	}
	if n := len(s.hist[fwd]); n != steadyWindow {
		t.Errorf("history of %d, want the window %d", n, steadyWindow)
	}
	// A lasting change comes through within half a window.
	var got time.Duration
	for range steadyWindow/2 + 1 {
		got = s.observe(fwd, 40*ms)
	}
	if got != 40*ms {
		t.Errorf("after half a window at 40 ms: %v", got)
	}
}

// TestSteadyCostsPerWork checks that histories belong to a stage's work,
// not to the plan that assigned it: a worker handed back layers it
// computed before carries on with their history (its first, colder
// execution does not move the median), and only the least recently used
// of more than steadyWorks works is forgotten.
func TestSteadyCostsPerWork(t *testing.T) {
	var s steadyCosts
	ms := time.Millisecond
	work := func(i int) stageWork { return stageWork{model: "m", first: i, last: i + 2} }
	for range 9 {
		s.observe(opKey{work: work(0), n: 4}, 20*ms)
	}
	if got := s.observe(opKey{work: work(1), n: 4}, 7*ms); got != 7*ms {
		t.Errorf("other layers: %v, want their own 7ms", got)
	}
	if got := s.observe(opKey{work: work(0), n: 4}, 90*ms); got != 20*ms {
		t.Errorf("back to the first layers, a cold execution: %v, want their history's 20ms", got)
	}
	if got := s.observe(opKey{work: stageWork{model: "m", first: 0, last: 2, head: true}, n: 4}, 5*ms); got != 5*ms {
		t.Errorf("same layers as the last stage: %v, want a history of their own", got)
	}
	// Works 0, 1 and the head are kept; adding works up to one over the
	// bound forgets work 1, the least recently used.
	for i := 2; len(s.used) < steadyWorks; i++ {
		s.observe(opKey{work: work(i), n: 4}, ms)
	}
	s.observe(opKey{work: work(100), n: 4}, ms)
	if len(s.used) != steadyWorks {
		t.Fatalf("%d works kept, want %d", len(s.used), steadyWorks)
	}
	if _, ok := s.hist[opKey{work: work(1), n: 4}]; ok {
		t.Error("the least recently used work's history was kept")
	}
	if got := s.observe(opKey{work: work(0), n: 4}, 90*ms); got != 20*ms {
		t.Errorf("the recently used first layers lost their history: %v", got)
	}
}

// TestSteadyCostsColdExecutions checks that the executions of a freshly
// built stage's first iteration get the op's steady busy time without
// entering its history, unless it has none.
func TestSteadyCostsColdExecutions(t *testing.T) {
	var s steadyCosts
	ms := time.Millisecond
	k := opKey{work: stageWork{model: "m", first: 2, last: 5}, n: 2}
	if got := s.observeCold(k, 30*ms); got != 30*ms {
		t.Fatalf("cold without a history: %v, want its own 30ms", got)
	}
	for range 4 {
		s.observe(k, 10*ms)
	}
	// Switches back to the plan, each with a cold iteration: however many,
	// they neither move the steady time nor enter the history.
	for range 3 * steadyWindow {
		if got := s.observeCold(k, 30*ms); got != 10*ms {
			t.Fatalf("cold with a history of 10 ms: %v", got)
		}
	}
	if n := len(s.hist[k]); n != 5 {
		t.Fatalf("history of %d, want 5", n)
	}
	if got := s.observe(k, 12*ms); got != 10*ms {
		t.Fatalf("warm after cold ones: %v, want 10ms", got)
	}
}
