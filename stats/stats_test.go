package stats

import (
	"math"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	xs := []float64{5, 1, 4, 2}
	if s := Summarize(xs); s.Median != 3 || s.Min != 1 || s.Max != 5 {
		t.Fatalf("%+v", s)
	}
	if xs[0] != 5 {
		t.Fatal("input sorted in place")
	}
	if m := Median([]time.Duration{3, 1, 2}); m != 2 {
		t.Fatalf("median %v", m)
	}
	if s := Summarize[int](nil); s != (Summary[int]{}) {
		t.Fatalf("empty: %+v", s)
	}
	// +Inf in the middle: the median is +Inf, not NaN (a time never
	// reached counts as slower than any).
	inf := math.Inf(1)
	for _, xs := range [][]float64{{1, inf}, {inf, inf}, {1, inf, inf, inf}} {
		if m := Median(xs); !math.IsInf(m, 1) {
			t.Fatalf("median of %v: %v", xs, m)
		}
	}
	// The middle of two large values does not overflow.
	if m := Median([]int64{1<<62 + 2, 1<<62 + 4}); m != 1<<62+3 {
		t.Fatalf("median %d", m)
	}
}
