package profile

import "math/rand/v2"

// DrawSlowdowns draws n slowdown factors of emulated devices from
// U[lo, hi], as Sky Computing's experiments draw U[1, 6], from a PCG
// generator seeded with seed and stream: the same arguments give the same
// factors in every process. Each caller keeps a stream of its own, so
// that its draws do not change when another's do.
func DrawSlowdowns(n int, lo, hi float64, seed, stream uint64) []float64 {
	rng := rand.New(rand.NewPCG(seed, stream))
	out := make([]float64, n)
	for i := range out {
		out[i] = lo + (hi-lo)*rng.Float64()
	}
	return out
}
