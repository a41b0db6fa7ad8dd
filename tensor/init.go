package tensor

import (
	"math"
	"math/rand/v2"
)

// Seeded initializers. They take the random source explicitly, so a run is
// reproducible from its seed and nothing depends on a global generator.

// FillNormal sets every element of x to an independent draw from the normal
// distribution with the given mean and standard deviation, using rng.
func FillNormal(x []float32, rng *rand.Rand, mean, std float32) {
	for i := range x {
		x[i] = mean + std*float32(rng.NormFloat64())
	}
}

// FillUniform sets every element of x to an independent draw from the
// uniform distribution on [lo, hi), using rng.
func FillUniform(x []float32, rng *rand.Rand, lo, hi float32) {
	w := float64(hi) - float64(lo)
	for i := range x {
		v := float32(float64(lo) + w*rng.Float64())
		if v >= hi && hi > lo { // rounding to float32 may land on hi
			v = math.Nextafter32(hi, lo)
		}
		x[i] = v
	}
}
