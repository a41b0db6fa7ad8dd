package pipeline

import (
	"testing"
	"time"
)

func TestLatenessAimsEarlyByTheMedianOvershoot(t *testing.T) {
	var l lateness
	if got := l.aim(10 * time.Millisecond); got != 10*time.Millisecond {
		t.Fatalf("no history: aim %v, want the sleep itself", got)
	}
	// Overshoots of 1, 2 and 9 ms (one outlier): the median is 2 ms.
	for _, over := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 9 * time.Millisecond} {
		l.observe(10*time.Millisecond, 10*time.Millisecond+over)
	}
	if got := l.aim(10 * time.Millisecond); got != 8*time.Millisecond {
		t.Fatalf("aim %v, want 8ms", got)
	}
	// Never less than half the sleep.
	if got := l.aim(3 * time.Millisecond); got != 1500*time.Microsecond {
		t.Fatalf("aim %v, want 1.5ms", got)
	}
	// A sleep that ended early counts as on time; none asked, no sample.
	l.observe(10*time.Millisecond, 5*time.Millisecond)
	l.observe(0, time.Second)
	if len(l.hist) != 4 || l.hist[3] != 0 {
		t.Fatalf("history %v", l.hist)
	}
	// The window forgets the oldest.
	for range latenessWindow {
		l.observe(time.Millisecond, 1500*time.Microsecond)
	}
	if len(l.hist) != latenessWindow {
		t.Fatalf("history of %d, want %d", len(l.hist), latenessWindow)
	}
	if got := l.aim(10 * time.Millisecond); got != 9500*time.Microsecond {
		t.Fatalf("aim %v, want 9.5ms", got)
	}
}
