//go:build !amd64 || noasm

package tensor

// newGoGemm returns the portable pure-Go GEMM.
func newGoGemm() *goGemm { return newGenericGemm() }
