package profile

import (
	"slices"
	"testing"
)

func TestDrawSlowdowns(t *testing.T) {
	a := DrawSlowdowns(64, 1, 6, 1, 0x51d)
	if len(a) != 64 {
		t.Fatalf("%d factors", len(a))
	}
	lo, hi := slices.Min(a), slices.Max(a)
	if lo < 1 || hi >= 6 || hi-lo < 3 {
		t.Fatalf("factors span [%v, %v], want a wide part of [1, 6)", lo, hi)
	}
	if b := DrawSlowdowns(64, 1, 6, 1, 0x51d); !slices.Equal(a, b) {
		t.Fatal("the same seed and stream drew other factors")
	}
	if c := DrawSlowdowns(64, 1, 6, 1, 0x51e); slices.Equal(a, c) {
		t.Fatal("another stream drew the same factors")
	}
	if d := DrawSlowdowns(3, 2, 2, 9, 0); !slices.Equal(d, []float64{2, 2, 2}) {
		t.Fatalf("U[2, 2] drew %v", d)
	}
}
