//go:build !linux && !darwin

package tensor

import "errors"

// blasLib is never loaded on this OS.
type blasLib struct{ path string }

// loadBLAS reports that OpenBLAS is not supported here.
func loadBLAS() (*blasLib, error) {
	return nil, errors.New("tensor: OpenBLAS loading is only supported on linux and darwin")
}

// sgemm is never called because loadBLAS always fails.
func (l *blasLib) sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	panic("tensor: OpenBLAS is not available on this OS")
}
