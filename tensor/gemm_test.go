package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// refGemm is the textbook triple loop in float64.
func refGemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
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
				s += float64(av) * float64(bv)
			}
			v := float64(alpha) * s
			if beta != 0 {
				v += float64(beta) * float64(c[i*ldc+j])
			}
			c[i*ldc+j] = float32(v)
		}
	}
}

// reblock returns a copy of g's kernel with other block sizes.
func reblock(g *goGemm, kc, mc, minParallelFlops int) *goGemm {
	return &goGemm{name: g.name, mr: g.mr, nr: g.nr, kernel: g.kernel, kc: kc, mc: mc, minParallelFlops: minParallelFlops}
}

// gemmFunc is the signature shared by Gemm, GemmGo and Engine.Gemm.
type gemmFunc func(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)

// testEngines lists every implementation that can run on this machine.
func testEngines(t *testing.T) map[string]gemmFunc {
	t.Helper()
	es := map[string]gemmFunc{
		"Gemm":    Gemm,
		"GemmGo":  GemmGo,
		"generic": newGenericGemm().gemm,
	}
	// The generic kernel with tiny blocks and forced parallelism exercises
	// the multi-block, multi-task paths on small matrices.
	tiny := newGenericGemm()
	tiny.kc, tiny.mc, tiny.minParallelFlops = 7, 8, 0
	es["generic-tiny-blocks"] = tiny.gemm
	for name, g := range asmGemmsForTest() {
		es[name] = g.gemm
		es[name+"-tiny-blocks"] = reblock(g, 5, 2*g.mr, 0).gemm
	}
	if e, err := BLASEngine(); err == nil {
		es["openblas"] = e.Gemm
	} else {
		t.Logf("OpenBLAS not tested: %v", err)
	}
	return es
}

type gemmCase struct {
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	padA, padB     int // extra stride beyond the stored row
	padC           int
}

func (tc gemmCase) String() string {
	return fmt.Sprintf("tA=%v,tB=%v,m=%d,n=%d,k=%d,alpha=%g,beta=%g,pad=%d/%d/%d", tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, tc.beta, tc.padA, tc.padB, tc.padC)
}

// run executes one case with f and compares it with refGemm.
func (tc gemmCase) run(t *testing.T, f gemmFunc, rng *rand.Rand) {
	t.Helper()
	ar, ac := tc.m, tc.k
	if tc.transA {
		ar, ac = ac, ar
	}
	br, bc := tc.k, tc.n
	if tc.transB {
		br, bc = bc, br
	}
	lda, ldb, ldc := max(1, ac+tc.padA), max(1, bc+tc.padB), max(1, tc.n+tc.padC)
	a := randSlice(rng, ar*lda)
	b := randSlice(rng, br*ldb)
	c := randSlice(rng, tc.m*ldc)
	if tc.beta == 0 {
		// beta == 0 must not read C.
		for i := range c {
			c[i] = float32(math.NaN())
		}
	}
	want := append([]float32(nil), c...)
	refGemm(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, a, lda, b, ldb, tc.beta, want, ldc)
	f(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, a, lda, b, ldb, tc.beta, c, ldc)
	tol := 1e-5 * float64(tc.k+4) // values are in [-1, 1)
	for i := 0; i < tc.m; i++ {
		for j := 0; j < ldc; j++ {
			got, exp := c[i*ldc+j], want[i*ldc+j]
			if j >= tc.n {
				// Padding must be left untouched (NaN stays NaN).
				if math.Float32bits(got) != math.Float32bits(exp) {
					t.Fatalf("%v: padding C[%d,%d] changed: %v -> %v", tc, i, j, exp, got)
				}
				continue
			}
			if d := math.Abs(float64(got - exp)); !(d <= tol) {
				t.Fatalf("%v: C[%d,%d] = %v, want %v (|diff| %g > %g)", tc, i, j, got, exp, d, tol)
			}
		}
	}
}

func randSlice(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	FillUniform(x, rng, -1, 1)
	return x
}

func TestGemmEdgeShapes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dims := []int{0, 1, 2, 3, 5, 8, 13, 17, 33}
	for name, f := range testEngines(t) {
		t.Run(name, func(t *testing.T) {
			for _, tA := range []bool{false, true} {
				for _, tB := range []bool{false, true} {
					for _, m := range dims {
						for _, n := range dims {
							for _, k := range []int{0, 1, 4, 19} {
								tc := gemmCase{transA: tA, transB: tB, m: m, n: n, k: k, alpha: 1, beta: 0}
								if (m+n+k)%3 == 0 {
									tc.alpha, tc.beta = -0.5, 1.5
								} else if (m+n+k)%3 == 1 {
									tc.beta = 1
								}
								tc.padA, tc.padB, tc.padC = (m+k)%3, (n+k)%2, m%2
								tc.run(t, f, rng)
							}
						}
					}
				}
			}
		})
	}
}

func TestGemmRandomShapes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	iters := 40
	if testing.Short() {
		iters = 12
	}
	for name, f := range testEngines(t) {
		t.Run(name, func(t *testing.T) {
			for it := 0; it < iters; it++ {
				tc := gemmCase{
					transA: rng.IntN(2) == 0, transB: rng.IntN(2) == 0,
					m: 1 + rng.IntN(150), n: 1 + rng.IntN(150), k: 1 + rng.IntN(300),
					alpha: []float32{1, -1, 0.25, 0}[rng.IntN(4)],
					beta:  []float32{0, 1, -2, 0.5}[rng.IntN(4)],
					padA:  rng.IntN(3), padB: rng.IntN(3), padC: rng.IntN(3),
				}
				tc.run(t, f, rng)
			}
		})
	}
}

// TestGemmLargeParallel covers several kc blocks and the parallel task
// split with the real block sizes.
func TestGemmLargeParallel(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Log("GOMAXPROCS < 2: parallel split is not exercised")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	cases := []gemmCase{
		{m: 300, n: 257, k: 530, alpha: 1, beta: 0},
		{transA: true, transB: true, m: 64, n: 700, k: 300, alpha: 0.5, beta: 1, padA: 3, padC: 5},
	}
	for _, tc := range cases {
		for _, name := range []string{"Gemm", "GemmGo"} {
			t.Run(name+"/"+tc.String(), func(t *testing.T) { tc.run(t, testEngines(t)[name], rng) })
		}
	}
}

func TestGemmPanicsOnShortSlices(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"short A", func() {
			Gemm(false, false, 2, 2, 2, 1, make([]float32, 3), 2, make([]float32, 4), 2, 0, make([]float32, 4), 2)
		}},
		{"short C", func() {
			Gemm(false, false, 2, 2, 2, 1, make([]float32, 4), 2, make([]float32, 4), 2, 0, make([]float32, 3), 2)
		}},
		{"small lda", func() {
			Gemm(true, false, 3, 2, 2, 1, make([]float32, 9), 2, make([]float32, 4), 2, 0, make([]float32, 6), 2)
		}},
		{"negative", func() { Gemm(false, false, -1, 2, 2, 1, nil, 2, nil, 2, 0, nil, 2) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			tc.f()
		})
	}
}

func TestMatMul(t *testing.T) {
	a := FromSlice([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	b := FromSlice([]float32{1, 0, 0, 1, 1, 1}, 3, 2)
	got := MatMul(a, b, false, false)
	want := []float32{4, 5, 10, 11}
	if !SameShape(got.Shape, []int{2, 2}) {
		t.Fatalf("shape %v", got.Shape)
	}
	for i := range want {
		if got.Data[i] != want[i] {
			t.Fatalf("MatMul = %v, want %v", got.Data, want)
		}
	}
	// aᵀ·a is 3×3 and symmetric.
	g := MatMul(a, a, true, false)
	if g.Shape[0] != 3 || g.Shape[1] != 3 || g.Data[1] != g.Data[3] || g.Data[0] != 17 {
		t.Fatalf("aᵀa = %v", g)
	}
}

func TestBackendNames(t *testing.T) {
	if Backend() == "" || GoEngine().Name() == "" {
		t.Fatal("empty backend name")
	}
	if _, err := BLASEngine(); err == nil && DefaultEngine().blas == nil {
		t.Fatal("OpenBLAS loaded but the default engine does not use it")
	}
	t.Logf("backend %s", Backend())
}

func TestForceGoBackend(t *testing.T) {
	bs := newBackends("go")
	if bs.blasEngine != nil || bs.blasErr == nil || bs.defEngine != bs.goEngine {
		t.Fatalf("SKYHIVE_BLAS=go still uses %s", bs.defEngine.Name())
	}
	bs = newBackends("")
	if (bs.blasEngine == nil) == (bs.blasErr == nil) {
		t.Fatalf("inconsistent backends: engine %v, error %v", bs.blasEngine, bs.blasErr)
	}
}

// TestGemmConcurrent runs products from several goroutines at once, as the
// in-process swarm does, and checks every result.
func TestGemmConcurrent(t *testing.T) {
	const goroutines, n = 6, 160
	for name, f := range map[string]gemmFunc{"Gemm": Gemm, "GemmGo": GemmGo} {
		t.Run(name, func(t *testing.T) {
			errs := make(chan error, goroutines)
			for g := 0; g < goroutines; g++ {
				go func() {
					rng := rand.New(rand.NewPCG(uint64(g), 9))
					a, b := randSlice(rng, n*n), randSlice(rng, n*n)
					want := make([]float32, n*n)
					refGemm(false, true, n, n, n, 1, a, n, b, n, 0, want, n)
					for it := 0; it < 5; it++ {
						c := make([]float32, n*n)
						f(false, true, n, n, n, 1, a, n, b, n, 0, c, n)
						for i := range c {
							if math.Abs(float64(c[i]-want[i])) > 1e-4 {
								errs <- fmt.Errorf("goroutine %d: C[%d] = %v, want %v", g, i, c[i], want[i])
								return
							}
						}
					}
					errs <- nil
				}()
			}
			for g := 0; g < goroutines; g++ {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestDefaultEngineSharesBLAS checks that the default engine computes a
// product with the Go kernel, correctly, while OpenBLAS is busy with
// another caller's, and that the explicit OpenBLAS engine never does.
func TestDefaultEngineSharesBLAS(t *testing.T) {
	bs := newBackends("")
	if bs.blasEngine == nil {
		t.Skip("OpenBLAS not installed:", bs.blasErr)
	}
	if bs.blasEngine.shareBLAS || !bs.defEngine.shareBLAS {
		t.Fatal("only the default engine may fall back to Go while OpenBLAS is busy")
	}
	const m, n, k = 33, 17, 29
	rng := rand.New(rand.NewPCG(1, 2))
	a, b := randSlice(rng, m*k), randSlice(rng, k*n)
	want := make([]float32, m*n)
	refGemm(false, false, m, n, k, 1, a, k, b, n, 0, want, n)
	bs.defEngine.busy.Store(1) // as if another goroutine were inside OpenBLAS
	c := make([]float32, m*n)
	bs.defEngine.Gemm(false, false, m, n, k, 1, a, k, b, n, 0, c, n)
	if got := bs.defEngine.busy.Load(); got != 1 {
		t.Fatalf("busy count %d after a fallback call, want 1", got)
	}
	for i := range c {
		if math.Abs(float64(c[i]-want[i])) > 1e-4 {
			t.Fatalf("fallback C[%d] = %v, want %v", i, c[i], want[i])
		}
	}
}

func TestSelectBackendAfterFirstProduct(t *testing.T) {
	c := make([]float32, 1)
	Gemm(false, false, 1, 1, 1, 1, []float32{2}, 1, []float32{3}, 1, 0, c, 1)
	other := "go"
	if Backend() == GoEngine().Name() {
		other = "auto"
		if _, err := BLASEngine(); err != nil {
			t.Skip("no OpenBLAS: both choices give the Go kernel")
		}
	}
	if err := SelectBackend(other); err == nil {
		t.Fatalf("switching to %q after the first product accepted", other)
	}
	if err := SelectBackend("fast"); err == nil {
		t.Fatal("unknown backend accepted")
	}
}
