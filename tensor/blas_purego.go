//go:build linux || darwin

package tensor

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/ebitengine/purego"
)

// CBLAS enumeration values (cblas.h).
const (
	cblasRowMajor = 101
	cblasNoTrans  = 111
	cblasTrans    = 112
)

// blasLib is a loaded OpenBLAS. The library is never unloaded.
type blasLib struct {
	path string
	// cblasSgemm is cblas_sgemm with the 32-bit integer (LP64) interface
	// of the distribution packages.
	cblasSgemm func(order, transA, transB, m, n, k int32, alpha float32, a *float32, lda int32, b *float32, ldb int32, beta float32, c *float32, ldc int32)
}

// blasNames lists the library names tried, in order.
func blasNames() []string {
	if runtime.GOOS == "darwin" {
		return []string{"libopenblas.0.dylib", "libopenblas.dylib"}
	}
	return []string{"libopenblas.so.0", "libopenblas.so"}
}

// loadBLAS opens OpenBLAS with dlopen and binds cblas_sgemm.
func loadBLAS() (*blasLib, error) {
	var errs []error
	for _, name := range blasNames() {
		h, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			errs = append(errs, fmt.Errorf("dlopen %s: %w", name, err))
			continue
		}
		sym, err := purego.Dlsym(h, "cblas_sgemm")
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: cblas_sgemm: %w", name, err))
			continue
		}
		lib := &blasLib{path: name}
		purego.RegisterFunc(&lib.cblasSgemm, sym)
		return lib, nil
	}
	return nil, fmt.Errorf("tensor: OpenBLAS not available: %w", errors.Join(errs...))
}

// sgemm calls cblas_sgemm in row-major order. The arguments must have been
// validated by checkGemm and fit in int32.
func (l *blasLib) sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	ta, tb := int32(cblasNoTrans), int32(cblasNoTrans)
	if transA {
		ta = cblasTrans
	}
	if transB {
		tb = cblasTrans
	}
	// With k == 0, A and B may be empty; BLAS does not read them but we
	// still need valid pointers.
	var dummy float32
	pa, pb := &dummy, &dummy
	if len(a) > 0 {
		pa = &a[0]
	}
	if len(b) > 0 {
		pb = &b[0]
	}
	l.cblasSgemm(cblasRowMajor, ta, tb, int32(m), int32(n), int32(k), alpha, pa, int32(lda), pb, int32(ldb), beta, &c[0], int32(ldc))
	// The Go heap does not move, but a, b and c must stay reachable until
	// the C call has returned.
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	runtime.KeepAlive(c)
}
