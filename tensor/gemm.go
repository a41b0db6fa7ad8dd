package tensor

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"sync/atomic"
)

// GEMM backends. Two implementations exist:
//
//   - OpenBLAS, loaded at run time with dlopen (no cgo needed) from
//     libopenblas.so.0 or libopenblas.so, calling cblas_sgemm;
//   - a pure-Go blocked, packed and parallel kernel whose inner loop is an
//     AVX-512 or AVX2+FMA assembly micro-kernel on amd64 CPUs that have them
//     and plain Go elsewhere.
//
// Gemm uses OpenBLAS for every size when it is found (unless another call
// is already running there, see DefaultEngine): measured on a 2-core
// AVX-512 machine, OpenBLAS (with the foreign call, about 0.7 µs) was faster
// than the Go kernel at every size from 4×4×4 up, by about 2× below
// 100×100×100 (OpenBLAS runs small products on one thread), so no size
// threshold sends work to Go. SelectBackend("go") before the first GEMM (or
// the environment variable SKYHIVE_BLAS=go) forces the pure-Go kernel. The
// choice is made once, lazily, at the first call (see defaultBackends); it
// is the package's only state besides the packing-buffer pool of the Go
// kernel.

// Engine is one GEMM implementation. The zero value is not usable; get one
// from GoEngine, BLASEngine or DefaultEngine. Engines are safe for
// concurrent use.
type Engine struct {
	name string
	goK  *goGemm  // pure-Go kernel; always set
	blas *blasLib // OpenBLAS, or nil
	// shareBLAS sends a product to the Go kernel instead when another
	// OpenBLAS call of this engine is in flight (see DefaultEngine).
	shareBLAS bool
	busy      atomic.Int32
}

// Name describes the engine: "openblas", or the Go kernel's name such as
// "go-avx512", "go-avx2" or "go-generic".
func (e *Engine) Name() string { return e.name }

// Gemm computes C = alpha*op(A)*op(B) + beta*C like the package-level Gemm,
// with this engine.
func (e *Engine) Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	checkGemm(transA, transB, m, n, k, a, lda, b, ldb, c, ldc)
	if e.blas != nil && fitsInt32(m, n, k, lda, ldb, ldc) {
		if !e.shareBLAS {
			e.blas.sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
			return
		}
		if e.busy.Add(1) == 1 {
			e.blas.sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
			e.busy.Add(-1)
			return
		}
		e.busy.Add(-1)
	}
	e.goK.gemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// backends holds the lazily built engines.
type backends struct {
	goEngine, blasEngine, defEngine *Engine
	blasErr                         error
}

// choice is the process's GEMM backend: chosen by SelectBackend (or the
// SKYHIVE_BLAS environment variable) before the first GEMM, built once at
// the first GEMM.
var choice struct {
	mu    sync.Mutex
	name  string // "", "auto" or "go"
	built *backends
	ready atomic.Pointer[backends] // built, for the lock-free fast path
}

// SelectBackend chooses the GEMM backend of the whole process: "auto"
// (OpenBLAS when installed, with the Go kernel for products issued while
// OpenBLAS is busy; see DefaultEngine) or "go" (the pure-Go kernel only).
// It must be called before the first GEMM; choosing another backend after
// that is an error. Without a call, SKYHIVE_BLAS=go selects "go".
func SelectBackend(name string) error {
	if name != "auto" && name != "go" {
		return fmt.Errorf("tensor: unknown GEMM backend %q (want auto or go)", name)
	}
	choice.mu.Lock()
	defer choice.mu.Unlock()
	if choice.built != nil && choice.name != name {
		return fmt.Errorf("tensor: GEMM backend already in use (%s); select %q before the first product", choice.built.defEngine.name, name)
	}
	choice.name = name
	return nil
}

// defaultBackends builds the engines once, at the first GEMM, as
// SelectBackend or the SKYHIVE_BLAS environment variable say.
func defaultBackends() *backends {
	if bs := choice.ready.Load(); bs != nil {
		return bs
	}
	choice.mu.Lock()
	defer choice.mu.Unlock()
	if choice.built == nil {
		if choice.name == "" {
			choice.name = "auto"
			if os.Getenv("SKYHIVE_BLAS") == "go" {
				choice.name = "go"
			}
		}
		choice.built = newBackends(choice.name)
		choice.ready.Store(choice.built)
	}
	return choice.built
}

// newBackends picks the best Go micro-kernel for this CPU and tries to load
// OpenBLAS unless blasEnv is "go", then logs the choice at debug level.
func newBackends(blasEnv string) *backends {
	var bs backends
	g := newGoGemm()
	bs.goEngine = &Engine{name: g.name, goK: g}
	var lib *blasLib
	err := errors.New("tensor: OpenBLAS disabled (GEMM backend go)")
	if blasEnv != "go" {
		lib, err = loadBLAS()
	}
	if err != nil {
		bs.blasErr = err
		bs.defEngine = bs.goEngine
		slog.Debug("tensor: GEMM backend", "backend", g.name, "openblas", err.Error())
		return &bs
	}
	bs.blasEngine = &Engine{name: "openblas", goK: g, blas: lib}
	bs.defEngine = &Engine{name: "openblas", goK: g, blas: lib, shareBLAS: true}
	slog.Debug("tensor: GEMM backend", "backend", "openblas", "library", lib.path)
	return &bs
}

// GoEngine returns the pure-Go engine with the fastest micro-kernel this
// CPU supports.
func GoEngine() *Engine { return defaultBackends().goEngine }

// BLASEngine returns the engine that sends every product to OpenBLAS (except
// those with a dimension beyond the 32-bit CBLAS interface, which run in
// Go), or an error saying why OpenBLAS is not available (not installed, unsupported
// OS, or disabled by SKYHIVE_BLAS=go).
func BLASEngine() (*Engine, error) {
	bs := defaultBackends()
	return bs.blasEngine, bs.blasErr
}

// DefaultEngine returns the engine Gemm uses. With OpenBLAS loaded it sends
// each product to OpenBLAS unless another goroutine's product is already
// running there, in which case it computes this one with the Go kernel
// instead of waiting: Debian's threaded OpenBLAS runs one caller at a time
// on its thread pool, so many goroutines issuing small products (expert
// servers, simulated swarms) would otherwise queue behind each other.
// Measured with 8 concurrent callers at 128×128×64, OpenBLAS alone gave
// 57 GFLOP/s and the Go kernel 141; a single caller is unaffected.
func DefaultEngine() *Engine { return defaultBackends().defEngine }

// Backend names the GEMM backend Gemm uses: "openblas" when the library is
// loaded, or otherwise the Go kernel's name such as "go-avx512", "go-avx2"
// or "go-generic".
func Backend() string { return DefaultEngine().name }

// Gemm computes C = alpha*op(A)*op(B) + beta*C for row-major matrices, where
// op(X) is X or its transpose. op(A) is m×k, op(B) is k×n, C is m×n; lda, ldb
// and ldc are the row strides of A, B and C as stored (A is stored m×k, or
// k×m when transA; likewise B). When beta is 0, C is not read, so it may
// hold garbage or NaN. C must not overlap A or B.
//
// It uses OpenBLAS when the library is installed and a pure-Go kernel
// otherwise (see Backend). It panics on negative sizes, strides smaller than
// a stored row, or slices too short for the sizes: those are programming
// errors that would otherwise let OpenBLAS read or write out of bounds.
func Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	DefaultEngine().Gemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// GemmGo is Gemm computed by the pure-Go kernel regardless of OpenBLAS.
func GemmGo(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	GoEngine().Gemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// checkGemm panics unless the sizes, strides and slice lengths of a GEMM
// are consistent.
func checkGemm(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("tensor: Gemm: negative size m=%d n=%d k=%d", m, n, k))
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	checkStored("A", a, ar, ac, lda)
	checkStored("B", b, br, bc, ldb)
	checkStored("C", c, m, n, ldc)
}

// checkStored checks one row-major matrix of rows×cols with stride ld.
func checkStored(name string, x []float32, rows, cols, ld int) {
	if ld < max(1, cols) {
		panic(fmt.Sprintf("tensor: Gemm: ld%s=%d < max(1, %d columns)", name, ld, cols))
	}
	if rows == 0 || cols == 0 {
		return
	}
	if need := (rows-1)*ld + cols; len(x) < need {
		panic(fmt.Sprintf("tensor: Gemm: %s has %d elements, %d×%d with stride %d needs %d", name, len(x), rows, cols, ld, need))
	}
}

// fitsInt32 reports whether all xs fit the 32-bit integers of the CBLAS
// interface.
func fitsInt32(xs ...int) bool {
	for _, x := range xs {
		if x > math.MaxInt32 {
			return false
		}
	}
	return true
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
		panic(fmt.Sprintf("tensor: MatMul inner dimensions differ: %v·%v (transA=%v, transB=%v)", a.Shape, b.Shape, transA, transB))
	}
	c := New(m, n)
	Gemm(transA, transB, m, n, k, 1, a.Data, max(1, a.Shape[1]), b.Data, max(1, b.Shape[1]), 0, c.Data, max(1, n))
	return c
}
