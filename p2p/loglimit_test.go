package p2p

import (
	"testing"
	"time"
)

// TestLogLimit: per kind, at most limitedLogs warnings a minute pass; the
// suppressed ones are counted on the next that passes, a minute later.
func TestLogLimit(t *testing.T) {
	var l logLimit
	t0 := time.Unix(1000, 0)
	passed := 0
	for i := range 100 {
		if ok, sup := l.allow("a", t0.Add(time.Duration(i)*time.Millisecond)); ok {
			passed++
			if sup != 0 {
				t.Fatalf("suppressed %d before any was", sup)
			}
		}
	}
	if passed != limitedLogs {
		t.Fatalf("%d of 100 passed, want %d", passed, limitedLogs)
	}
	if ok, _ := l.allow("b", t0); !ok {
		t.Fatal("another kind was limited too")
	}
	ok, sup := l.allow("a", t0.Add(time.Minute))
	if !ok || sup != 100-limitedLogs {
		t.Fatalf("a minute later: ok %v, suppressed %d, want %d", ok, sup, 100-limitedLogs)
	}
}
