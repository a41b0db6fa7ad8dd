package tensor

import (
	"fmt"
	"math"
)

// Element-wise kernels on slices. Shapes are the caller's business: every
// kernel panics if its slices are shorter than the lengths it was asked to
// process. Binary kernels process len(dst) elements (or len(x) for the
// in-place ones), so a, b must be at least that long. None of them allocate.
//
// The loops are written so the compiler can drop bounds checks (one length
// check up front, then re-slicing to the same length) and are unrolled by 4
// by advancing the slices themselves, which is about twice as fast as an
// indexed loop in Go; the reductions keep four independent accumulators.

// checkLen panics with a readable message if any slice in xs is shorter
// than n.
func checkLen(op string, n int, xs ...[]float32) {
	for _, x := range xs {
		if len(x) < n {
			panic(fmt.Sprintf("tensor: %s: slice of length %d, need %d", op, len(x), n))
		}
	}
}

// checkMat panics unless x holds at least rows×cols elements and the
// dimensions are not negative.
func checkMat(op string, rows, cols int, xs ...[]float32) {
	if rows < 0 || cols < 0 {
		panic(fmt.Sprintf("tensor: %s: negative shape %d×%d", op, rows, cols))
	}
	checkLen(op, rows*cols, xs...)
}

// Add sets dst[i] = a[i] + b[i] for i < len(dst). dst may alias a or b.
func Add(dst, a, b []float32) {
	checkLen("Add", len(dst), a, b)
	a, b = a[:len(dst)], b[:len(dst)]
	for len(dst) >= 4 && len(a) >= 4 && len(b) >= 4 {
		dst[0] = a[0] + b[0]
		dst[1] = a[1] + b[1]
		dst[2] = a[2] + b[2]
		dst[3] = a[3] + b[3]
		dst, a, b = dst[4:], a[4:], b[4:]
	}
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

// Sub sets dst[i] = a[i] - b[i] for i < len(dst). dst may alias a or b.
func Sub(dst, a, b []float32) {
	checkLen("Sub", len(dst), a, b)
	a, b = a[:len(dst)], b[:len(dst)]
	for len(dst) >= 4 && len(a) >= 4 && len(b) >= 4 {
		dst[0] = a[0] - b[0]
		dst[1] = a[1] - b[1]
		dst[2] = a[2] - b[2]
		dst[3] = a[3] - b[3]
		dst, a, b = dst[4:], a[4:], b[4:]
	}
	for i := range dst {
		dst[i] = a[i] - b[i]
	}
}

// Mul sets dst[i] = a[i] * b[i] for i < len(dst). dst may alias a or b.
func Mul(dst, a, b []float32) {
	checkLen("Mul", len(dst), a, b)
	a, b = a[:len(dst)], b[:len(dst)]
	for len(dst) >= 4 && len(a) >= 4 && len(b) >= 4 {
		dst[0] = a[0] * b[0]
		dst[1] = a[1] * b[1]
		dst[2] = a[2] * b[2]
		dst[3] = a[3] * b[3]
		dst, a, b = dst[4:], a[4:], b[4:]
	}
	for i := range dst {
		dst[i] = a[i] * b[i]
	}
}

// Scale sets x[i] *= alpha.
func Scale(alpha float32, x []float32) {
	for len(x) >= 4 {
		x[0] *= alpha
		x[1] *= alpha
		x[2] *= alpha
		x[3] *= alpha
		x = x[4:]
	}
	for i := range x {
		x[i] *= alpha
	}
}

// AddScalar sets x[i] += alpha.
func AddScalar(alpha float32, x []float32) {
	for len(x) >= 4 {
		x[0] += alpha
		x[1] += alpha
		x[2] += alpha
		x[3] += alpha
		x = x[4:]
	}
	for i := range x {
		x[i] += alpha
	}
}

// Axpy sets y[i] += alpha * x[i] for i < len(y).
func Axpy(alpha float32, x, y []float32) {
	checkLen("Axpy", len(y), x)
	x = x[:len(y)]
	for len(y) >= 4 && len(x) >= 4 {
		y[0] += alpha * x[0]
		y[1] += alpha * x[1]
		y[2] += alpha * x[2]
		y[3] += alpha * x[3]
		x, y = x[4:], y[4:]
	}
	for i := range y {
		y[i] += alpha * x[i]
	}
}

// SumSquares returns the sum of x[i]² in float64, which cannot overflow
// for float32 inputs: it is finite exactly when every x[i] is. It sums in
// eight interleaved partial sums, so that the adds do not wait on each
// other (norms of whole gradients and contributions are on hot paths).
func SumSquares(x []float32) float64 {
	var s0, s1, s2, s3, s4, s5, s6, s7 float64
	i := 0
	for ; i+8 <= len(x); i += 8 {
		v := x[i : i+8 : i+8]
		a0, a1, a2, a3 := float64(v[0]), float64(v[1]), float64(v[2]), float64(v[3])
		a4, a5, a6, a7 := float64(v[4]), float64(v[5]), float64(v[6]), float64(v[7])
		s0 += a0 * a0
		s1 += a1 * a1
		s2 += a2 * a2
		s3 += a3 * a3
		s4 += a4 * a4
		s5 += a5 * a5
		s6 += a6 * a6
		s7 += a7 * a7
	}
	for ; i < len(x); i++ {
		s0 += float64(x[i]) * float64(x[i])
	}
	return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
}

// Dot returns the sum of x[i]*y[i] for i < len(x). It sums in four
// interleaved partial sums, so the rounding differs slightly from a
// sequential loop.
func Dot(x, y []float32) float32 {
	checkLen("Dot", len(x), y)
	y = y[:len(x)]
	var s0, s1, s2, s3 float32
	for len(x) >= 4 && len(y) >= 4 {
		s0 += x[0] * y[0]
		s1 += x[1] * y[1]
		s2 += x[2] * y[2]
		s3 += x[3] * y[3]
		x, y = x[4:], y[4:]
	}
	for i := range x {
		s0 += x[i] * y[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// Sum returns the sum of x, accumulated in four interleaved partial sums.
func Sum(x []float32) float32 {
	var s0, s1, s2, s3 float32
	for len(x) >= 4 {
		s0 += x[0]
		s1 += x[1]
		s2 += x[2]
		s3 += x[3]
		x = x[4:]
	}
	for _, v := range x {
		s0 += v
	}
	return (s0 + s1) + (s2 + s3)
}

// Max returns the largest element of x, -Inf if x is empty, and NaN if any
// element is NaN.
func Max(x []float32) float32 {
	m := float32(math.Inf(-1))
	for _, v := range x {
		if v > m || v != v {
			m = v
			if v != v {
				return v
			}
		}
	}
	return m
}

// Copy copies src into dst; it panics unless len(src) >= len(dst) and
// copies exactly len(dst) elements.
func Copy(dst, src []float32) {
	checkLen("Copy", len(dst), src)
	copy(dst, src)
}

// Fill sets every element of x to v.
func Fill(x []float32, v float32) {
	if v == 0 {
		clear(x)
		return
	}
	for i := range x {
		x[i] = v
	}
}

// ReLU sets dst[i] = max(x[i], 0) for i < len(dst); dst may alias x.
// NaN inputs give 0.
func ReLU(dst, x []float32) {
	n := len(dst)
	checkLen("ReLU", n, x)
	x = x[:n]
	for i, v := range x {
		if v > 0 {
			dst[i] = v
		} else {
			dst[i] = 0
		}
	}
}

// ReLUBackward sets dx[i] = dy[i] where x[i] > 0 and 0 elsewhere, for
// i < len(dx); x is the ReLU's input (its output works as well). dx may
// alias dy.
func ReLUBackward(dx, x, dy []float32) {
	n := len(dx)
	checkLen("ReLUBackward", n, x, dy)
	x, dy = x[:n], dy[:n]
	for i, v := range x {
		if v > 0 {
			dx[i] = dy[i]
		} else {
			dx[i] = 0
		}
	}
}

// AddRowVector adds bias (length cols) to every row of the rows×cols
// row-major matrix x: x[r*cols+c] += bias[c].
func AddRowVector(x, bias []float32, rows, cols int) {
	checkMat("AddRowVector", rows, cols, x)
	checkLen("AddRowVector", cols, bias)
	bias = bias[:cols]
	for r := 0; r < rows; r++ {
		Add(x[r*cols:(r+1)*cols], x[r*cols:(r+1)*cols], bias)
	}
}

// ColSums sets dst[c] to the sum over r of x[r*cols+c] for the rows×cols
// row-major matrix x (the gradient of a broadcast bias). dst must have at
// least cols elements; it is overwritten, not accumulated into.
func ColSums(dst, x []float32, rows, cols int) {
	checkMat("ColSums", rows, cols, x)
	checkLen("ColSums", cols, dst)
	dst = dst[:cols]
	clear(dst)
	for r := 0; r < rows; r++ {
		Add(dst, dst, x[r*cols:(r+1)*cols])
	}
}

// MeanVarRows sets mean[r] and variance[r] to the mean and the population
// variance (divided by cols, as layer normalization uses) of row r of the
// rows×cols row-major matrix x. It makes two passes over each row, which
// keeps the variance accurate when the mean is large. Rows with cols == 0
// get mean 0 and variance 0.
func MeanVarRows(mean, variance, x []float32, rows, cols int) {
	checkMat("MeanVarRows", rows, cols, x)
	checkLen("MeanVarRows", rows, mean, variance)
	if cols == 0 {
		clear(mean[:rows])
		clear(variance[:rows])
		return
	}
	inv := 1 / float32(cols)
	for r := 0; r < rows; r++ {
		row := x[r*cols : (r+1)*cols]
		mu := Sum(row) * inv
		var s0, s1, s2, s3 float32
		for len(row) >= 4 {
			d0, d1, d2, d3 := row[0]-mu, row[1]-mu, row[2]-mu, row[3]-mu
			s0 += d0 * d0
			s1 += d1 * d1
			s2 += d2 * d2
			s3 += d3 * d3
			row = row[4:]
		}
		for _, v := range row {
			d := v - mu
			s0 += d * d
		}
		mean[r] = mu
		variance[r] = ((s0 + s1) + (s2 + s3)) * inv
	}
}

// Transpose2D writes the transpose of the rows×cols row-major matrix src
// into dst, which becomes cols×rows: dst[c*rows+r] = src[r*cols+c]. dst and
// src must not overlap. It works in square tiles to stay in cache.
func Transpose2D(dst, src []float32, rows, cols int) {
	checkMat("Transpose2D", rows, cols, dst, src)
	const tile = 32
	for r0 := 0; r0 < rows; r0 += tile {
		r1 := min(r0+tile, rows)
		for c0 := 0; c0 < cols; c0 += tile {
			c1 := min(c0+tile, cols)
			for r := r0; r < r1; r++ {
				srow := src[r*cols+c0 : r*cols+c1]
				for j, v := range srow {
					dst[(c0+j)*rows+r] = v
				}
			}
		}
	}
}
