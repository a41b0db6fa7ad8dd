package tensor

// Element-wise kernels on slices. Shapes are the caller's business; every
// kernel panics if its slices have different lengths where they must match.
// PLACEHOLDER implementations: the tensor owner makes them fast.

// Add sets dst[i] = a[i] + b[i].
func Add(dst, a, b []float32) {
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

// Sub sets dst[i] = a[i] - b[i].
func Sub(dst, a, b []float32) {
	for i := range dst {
		dst[i] = a[i] - b[i]
	}
}

// Mul sets dst[i] = a[i] * b[i].
func Mul(dst, a, b []float32) {
	for i := range dst {
		dst[i] = a[i] * b[i]
	}
}

// Scale sets x[i] *= alpha.
func Scale(alpha float32, x []float32) {
	for i := range x {
		x[i] *= alpha
	}
}

// Axpy sets y[i] += alpha * x[i].
func Axpy(alpha float32, x, y []float32) {
	for i := range y {
		y[i] += alpha * x[i]
	}
}

// Dot returns the sum of x[i]*y[i].
func Dot(x, y []float32) float32 {
	var s float32
	for i := range x {
		s += x[i] * y[i]
	}
	return s
}

// Sum returns the sum of x.
func Sum(x []float32) float32 {
	var s float32
	for _, v := range x {
		s += v
	}
	return s
}
