package pipeline

import (
	"math"
	"testing"
)

func TestOpSpreadPooledCV(t *testing.T) {
	var s opSpread
	if got := s.cv(); got != 0 {
		t.Fatalf("empty: %v", got)
	}
	// Forward ops 0.9 and 1.1 (±10% of 1), backward 1.8 and 2.2 (±10% of
	// 2), one lone op of another size: a pooled CV of 0.1.
	for _, c := range []struct {
		k opKind
		v float64
	}{
		{opKind{n: 2}, 0.9}, {opKind{n: 2}, 1.1},
		{opKind{backward: true, n: 2}, 1.8}, {opKind{backward: true, n: 2}, 2.2},
		{opKind{n: 1}, 5},
	} {
		s.add(c.k, c.v)
	}
	if got := s.cv(); math.Abs(got-0.1) > 1e-9 {
		t.Fatalf("cv %v, want 0.1", got)
	}
	// Identical times: no variation.
	var u opSpread
	for range 4 {
		u.add(opKind{n: 2}, 0.25)
	}
	if got := u.cv(); got > 1e-6 {
		t.Fatalf("identical times: cv %v", got)
	}
}
