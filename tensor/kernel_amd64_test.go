//go:build amd64 && !noasm

package tensor

// asmGemmsForTest returns a GEMM for every assembly kernel this CPU runs.
func asmGemmsForTest() map[string]*goGemm {
	gs := map[string]*goGemm{}
	if hasAVX2() {
		gs["avx2-6x16"] = &goGemm{mr: 6, nr: 16, kernel: asmKernel(6, 16, kernel6x16AVX2), kc: 256, mc: 120, minParallelFlops: 1 << 21}
	}
	if hasAVX512() {
		gs["avx512-8x32"] = &goGemm{mr: 8, nr: 32, kernel: asmKernel(8, 32, kernel8x32AVX512), kc: 256, mc: 128, minParallelFlops: 1 << 21}
	}
	return gs
}
