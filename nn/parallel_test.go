package nn

import (
	"sync/atomic"
	"testing"
)

func TestParallelForCoversOnce(t *testing.T) {
	for _, n := range []int{0, 1, 7, 100, 1001} {
		hits := make([]atomic.Int32, n)
		parallelFor(n, 10, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				hits[i].Add(1)
			}
		})
		for i := range hits {
			if hits[i].Load() != 1 {
				t.Fatalf("n=%d: index %d visited %d times", n, i, hits[i].Load())
			}
		}
	}
}

// Large inputs take the parallel paths; they must agree with row-by-row
// (serial) evaluation.
func TestParallelPathsMatchSerial(t *testing.T) {
	rng := newRNG(21)
	const rows, d = 64, 1024
	ln := NewLayerNorm(d, 1e-5)
	fillNormal(ln.Gamma.Value.Data, rng, 1)
	x := randTensor(rng, 1, rows, d)
	dy := randTensor(rng, 1, rows, d)
	y, st := ln.Forward(Ctx{}, x)
	dx := ln.Backward(st, dy)
	for r := 0; r < rows; r += 21 {
		xr := x.Reshape(rows, d).Data[r*d : (r+1)*d]
		yr, sr := ln.Forward(Ctx{}, fromRow(xr, 1, d))
		dxr := ln.Backward(sr, fromRow(dy.Data[r*d:(r+1)*d], 1, d))
		assertClose(t, "layernorm y", y.Data[r*d:(r+1)*d], yr.Data, 1e-6)
		assertClose(t, "layernorm dx", dx.Data[r*d:(r+1)*d], dxr.Data, 1e-5)
	}

	// Attention with many (batch, head) pairs against one batch at a time.
	a := NewMultiHeadAttention(64, 8, 0.2, rng)
	const b, s = 4, 48
	mask := randTensor(rng, 0, b, s)
	for i := range mask.Data {
		if i%s < s-i/s*5 {
			mask.Data[i] = 1
		}
	}
	xa := randTensor(rng, 1, b, s, 64)
	dya := randTensor(rng, 1, b, s, 64)
	ya, sa := a.Forward(Ctx{Mask: mask}, xa)
	dxa := a.Backward(sa, dya)
	n := s * 64
	for bi := 0; bi < b; bi++ {
		m1 := fromRow(mask.Data[bi*s:(bi+1)*s], 1, s)
		yb, sb := a.Forward(Ctx{Mask: m1}, fromRow(xa.Data[bi*n:(bi+1)*n], 1, s, 64))
		dxb := a.Backward(sb, fromRow(dya.Data[bi*n:(bi+1)*n], 1, s, 64))
		assertClose(t, "attention y", ya.Data[bi*n:(bi+1)*n], yb.Data, 1e-5)
		assertClose(t, "attention dx", dxa.Data[bi*n:(bi+1)*n], dxb.Data, 1e-4)
	}
}
