package peer

import (
	"math"
	"strings"
	"testing"
)

// TestLossAverageHasNoStartUpBias checks the progress line's loss: a
// falling loss must show as falling from the first step, not rise from 0
// as an uncorrected moving average does (0.54 → 3.98 while the loss fell).
func TestLossAverageHasNoStartUpBias(t *testing.T) {
	var a lossAverage
	if got := a.add(6); math.Abs(got-6) > 1e-9 {
		t.Fatalf("after one loss of 6 the average is %v, want 6", got)
	}
	prev := 6.0
	for i := 1; i < 300; i++ {
		loss := 6 - 3*float64(i)/300 // falling from 6 to 3
		got := a.add(loss)
		if got > prev+1e-9 {
			t.Fatalf("step %d: the average rose from %v to %v while the loss fell to %v", i+1, prev, got, loss)
		}
		if got < loss-1e-9 {
			t.Fatalf("step %d: the average %v is below every loss so far (%v)", i+1, got, loss)
		}
		prev = got
	}
	var c lossAverage
	for range 50 {
		if got := c.add(2.5); math.Abs(got-2.5) > 1e-9 {
			t.Fatalf("a constant loss of 2.5 averages to %v", got)
		}
	}
}

// TestWaitNoticeReportsChanges checks the notices of the wait for a run's
// peers: a line when the count changes, none when it does not (within
// waitNoticeEvery), and nothing without a writer.
func TestWaitNoticeReportsChanges(t *testing.T) {
	var out strings.Builder
	n := newWaitNotice(&out)
	n.update("r", 1, 3)
	n.update("r", 1, 3)
	n.update("r", 2, 3)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `run "r": 1 of 3 here`) || !strings.Contains(lines[1], "2 of 3 here") {
		t.Fatalf("notices:\n%s", out.String())
	}
	newWaitNotice(nil).update("r", 1, 3) // no writer: no output, no panic
}
