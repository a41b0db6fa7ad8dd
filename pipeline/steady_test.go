package pipeline

import (
	"testing"
	"time"
)

// TestSteadyCostsMedian checks that an op's steady busy time is the
// median of its recent executions, kept apart per op and window-bounded,
// and that a new generation starts afresh.
func TestSteadyCostsMedian(t *testing.T) {
	var s steadyCosts
	fwd, bwd := opKey{gen: 1, n: 4}, opKey{gen: 1, backward: true, n: 4}
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
	if got := s.observe(opKey{gen: 2, n: 4}, 7*ms); got != 7*ms || len(s.hist) != 1 {
		t.Errorf("new generation: %v with %d ops kept, want 7ms and 1", got, len(s.hist))
	}
}
