package tensor

import "math"

// Transcendental kernels. They use exp32, a float32 exponential that is
// several times faster than going through math.Exp in float64 and accurate
// to about 2 ulp, and its 8-wide AVX2 version (expSlice) on slices.

// chunk is the length of the stack buffers the kernels below compute
// exponentials in.
const chunk = 256

const (
	log2e  = 1.44269504088896341
	ln2Hi  = 0.693359375 // high bits of ln 2; n*ln2Hi is exact for |n| < 2^15
	ln2Lo  = -2.12194440e-4
	expMax = 88.72283935546875 // largest x with exp(x) < MaxFloat32
	expMin = -103.97208        // below this exp(x) rounds to 0

	geluC = 0.7978845608028654 // sqrt(2/pi)
	geluA = 0.044715
)

// exp32 returns e**x for float32 x with a relative error below 3e-7 for
// normal results. It returns +Inf above expMax, 0 below expMin, NaN for NaN,
// and gradual-underflow results in between.
func exp32(x float32) float32 {
	if !(x <= expMax) { // also catches NaN
		if x != x {
			return x
		}
		return float32(math.Inf(1))
	}
	if x < expMin {
		return 0
	}
	// x = n*ln2 + r with |r| <= ln2/2, then e**x = 2**n * e**r.
	t := x * log2e
	var n int32
	if t >= 0 {
		n = int32(t + 0.5)
	} else {
		n = int32(t - 0.5)
	}
	fn := float32(n)
	r := (x - fn*ln2Hi) - fn*ln2Lo
	// Degree-7 Taylor polynomial; the truncation error on |r| <= 0.347 is
	// below 5e-9.
	p := float32(1.0 / 5040)
	p = p*r + 1.0/720
	p = p*r + 1.0/120
	p = p*r + 1.0/24
	p = p*r + 1.0/6
	p = p*r + 0.5
	p = p*r + 1
	p = p*r + 1
	// Scale by 2**n, in two steps when 2**n is not a normal float32.
	switch {
	case n > 127:
		return p * pow2(127) * pow2(n-127)
	case n < -126:
		return p * pow2(-126) * pow2(n+126)
	}
	return p * pow2(n)
}

// pow2 returns 2**n for -126 <= n <= 127.
func pow2(n int32) float32 {
	return math.Float32frombits(uint32(n+127) << 23)
}

// Exp sets dst[i] = e**x[i] for i < len(dst); dst may alias x. The relative
// error is below 3e-7; overflow gives +Inf and NaN stays NaN.
func Exp(dst, x []float32) {
	checkLen("Exp", len(dst), x)
	expSlice(dst, x)
}

// SoftmaxRows replaces every row of the rows×cols row-major matrix x by its
// softmax, exp(x[j]-max) / Σ_k exp(x[k]-max). Subtracting the row maximum
// keeps it stable for any finite inputs. A row without a finite maximum
// (all -Inf, or containing +Inf or NaN) becomes NaN.
func SoftmaxRows(x []float32, rows, cols int) {
	checkMat("SoftmaxRows", rows, cols, x)
	for r := 0; r < rows; r++ {
		row := x[r*cols : (r+1)*cols]
		AddScalar(-Max(row), row)
		expSlice(row, row)
		Scale(1/Sum(row), row)
	}
}

// LogSoftmaxRows replaces every row of the rows×cols row-major matrix x by
// its log-softmax, x[j] - max - log Σ_k exp(x[k]-max), which is stable for
// any finite inputs (the usual input of a cross-entropy loss).
func LogSoftmaxRows(x []float32, rows, cols int) {
	checkMat("LogSoftmaxRows", rows, cols, x)
	for r := 0; r < rows; r++ {
		row := x[r*cols : (r+1)*cols]
		// (x-m) - log s keeps the precision that x - (m + log s) would lose
		// when |m| is large.
		AddScalar(-Max(row), row)
		var s float32
		var buf [chunk]float32
		for c := row; len(c) > 0; {
			e := buf[:min(chunk, len(c))]
			expSlice(e, c)
			s += Sum(e)
			c = c[len(e):]
		}
		AddScalar(-float32(math.Log(float64(s))), row)
	}
}

// GELU sets dst[i] = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) for
// i < len(dst), the tanh approximation used by BERT; dst may alias x. It is
// evaluated as x·σ(2u) with u the tanh argument, which is the same function
// without tanh's cancellation.
func GELU(dst, x []float32) {
	checkLen("GELU", len(dst), x)
	var buf [chunk]float32
	for len(dst) > 0 {
		n := min(chunk, len(dst))
		t, xs, d := buf[:n], x[:n], dst[:n]
		for i, v := range xs {
			t[i] = -2 * geluC * (v + geluA*v*v*v)
		}
		expSlice(t, t)
		for i, v := range xs {
			d[i] = v / (1 + t[i])
		}
		dst, x = dst[n:], x[n:]
	}
}

// GELUBackward sets dx[i] = dy[i]·GELU'(x[i]) for i < len(dx), where x is
// GELU's input and GELU is the tanh approximation computed by GELU. dx is
// overwritten, not accumulated into, and may alias dy or x.
func GELUBackward(dx, x, dy []float32) {
	checkLen("GELUBackward", len(dx), x, dy)
	var buf [chunk]float32
	for len(dx) > 0 {
		n := min(chunk, len(dx))
		t, xs, g, d := buf[:n], x[:n], dy[:n], dx[:n]
		for i, v := range xs {
			t[i] = -2 * geluC * (v + geluA*v*v*v)
		}
		expSlice(t, t)
		for i, v := range xs {
			du := geluC * (1 + 3*geluA*v*v)
			s := 1 / (1 + t[i]) // σ(2u) = (1+tanh u)/2
			d[i] = g[i] * (s + 2*v*s*(1-s)*du)
		}
		dx, x, dy = dx[n:], x[n:], dy[n:]
	}
}
