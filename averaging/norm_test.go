package averaging

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestNorm: the unrolled Norm matches a plain float64 sum for every length
// mod 8, and is not finite exactly when an element is not.
func TestNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := range 40 {
		x := make([]float32, n)
		var want float64
		for i := range x {
			x[i] = float32(rng.NormFloat64())
			want += float64(x[i]) * float64(x[i])
		}
		want = math.Sqrt(want)
		if got := Norm(x); math.Abs(got-want) > 1e-12*max(want, 1) {
			t.Fatalf("n=%d: Norm %v, want %v", n, got, want)
		}
		if n > 0 {
			x[n-1] = 3e38
			if math.IsInf(Norm(x), 0) {
				t.Fatalf("n=%d: the norm of finite 3e38 overflowed", n)
			}
			x[n/2] = float32(math.Inf(-1))
			if !math.IsInf(Norm(x), 1) {
				t.Fatalf("n=%d: Norm with -Inf = %v", n, Norm(x))
			}
			x[n/2] = float32(math.NaN())
			if !math.IsNaN(Norm(x)) {
				t.Fatalf("n=%d: Norm with NaN = %v", n, Norm(x))
			}
		}
	}
}

func BenchmarkNorm(b *testing.B) {
	x := make([]float32, 1<<20)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	b.SetBytes(4 << 20)
	for b.Loop() {
		Norm(x)
	}
}
