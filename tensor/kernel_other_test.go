//go:build !amd64 || noasm

package tensor

// asmGemmsForTest returns nothing: there are no assembly kernels here.
func asmGemmsForTest() map[string]*goGemm { return nil }
