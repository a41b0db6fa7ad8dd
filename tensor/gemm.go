package tensor

// Gemm computes C = alpha*op(A)*op(B) + beta*C for row-major matrices, where
// op(X) is X or its transpose. op(A) is m×k, op(B) is k×n, C is m×n; lda, ldb
// and ldc are the row strides of A, B and C as stored.
//
// It uses OpenBLAS when the library is installed and a pure-Go kernel
// otherwise (see Backend).
func Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	// PLACEHOLDER naive kernel: replaced by the blocked/OpenBLAS implementation.
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float32
			for p := 0; p < k; p++ {
				var av, bv float32
				if transA {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if transB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += av * bv
			}
			if beta == 0 {
				c[i*ldc+j] = alpha * s
			} else {
				c[i*ldc+j] = alpha*s + beta*c[i*ldc+j]
			}
		}
	}
}

// MatMul returns op(a)·op(b) for 2-D tensors.
func MatMul(a, b *Tensor, transA, transB bool) *Tensor {
	m, k := a.Shape[0], a.Shape[1]
	if transA {
		m, k = k, m
	}
	k2, n := b.Shape[0], b.Shape[1]
	if transB {
		k2, n = n, k2
	}
	if k != k2 {
		panic("tensor: MatMul inner dimensions differ")
	}
	c := New(m, n)
	Gemm(transA, transB, m, n, k, 1, a.Data, a.Shape[1], b.Data, b.Shape[1], 0, c.Data, n)
	return c
}
