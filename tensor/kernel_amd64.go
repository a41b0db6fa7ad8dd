//go:build amd64 && !noasm

package tensor

import "golang.org/x/sys/cpu"

//go:generate go run ./internal/asmgen kernel_amd64.s

// Assembly micro-kernels (kernel_amd64.s, written by internal/asmgen). Each computes
// C[0:mr, 0:nr] += A·B for k ≥ 1 on packed panels; see microKernel.

//go:noescape
func kernel6x16AVX2(k int, a, b *float32, ldb int, c *float32, ldc int)

//go:noescape
func kernel8x32AVX512(k int, a, b *float32, ldb int, c *float32, ldc int)

// asmKernel wraps an assembly kernel of tile mr×nr in a microKernel that
// checks, once per call, that the panels and the tile are in bounds.
func asmKernel(mr, nr int, f func(k int, a, b *float32, ldb int, c *float32, ldc int)) microKernel {
	return func(k int, ap, bp []float32, ldb int, c []float32, ldc int) {
		_ = ap[mr*k-1]
		_ = bp[(k-1)*ldb+nr-1]
		_ = c[(mr-1)*ldc+nr-1]
		f(k, &ap[0], &bp[0], ldb, &c[0], ldc)
	}
}

// hasAVX512 and hasAVX2 report the CPU features the kernels need (the OS
// must save the wide registers too, which x/sys/cpu checks).
func hasAVX512() bool { return cpu.X86.HasAVX512F }
func hasAVX2() bool   { return cpu.X86.HasAVX2 && cpu.X86.HasFMA }

// newGoGemm returns the pure-Go GEMM with the widest micro-kernel this CPU
// supports.
func newGoGemm() *goGemm {
	switch {
	case hasAVX512():
		return &goGemm{name: "go-avx512", mr: 8, nr: 32, kernel: asmKernel(8, 32, kernel8x32AVX512), kc: 256, mc: 128, minParallelFlops: 1 << 21}
	case hasAVX2():
		return &goGemm{name: "go-avx2", mr: 6, nr: 16, kernel: asmKernel(6, 16, kernel6x16AVX2), kc: 256, mc: 120, minParallelFlops: 1 << 21}
	}
	return newGenericGemm()
}
