package bench

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/skyhive/skyhive/tensor"
	"golang.org/x/sys/cpu"
	"gonum.org/v1/gonum/blas"
	gonumblas "gonum.org/v1/gonum/blas/gonum"
)

// gemmSuite measures single-precision GEMM throughput: the default backend
// (OpenBLAS when installed) against the machine's estimated fp32 peak, and
// the pure-Go kernel against gonum's Sgemm timed alternately in the same
// run.
func gemmSuite() Suite {
	return Suite{
		Name:  "gemm",
		Short: "GFLOP/s of sgemm at n=256, 512, 1024 and 64×1024·1024×4096: OpenBLAS vs peak, pure Go vs gonum",
		Run:   runGemm,
	}
}

// gemmShape is one C(m×n) = A(m×k)·B(k×n) product.
type gemmShape struct {
	name    string
	m, n, k int
}

func runGemm(ctx context.Context, o Options) ([]Result, error) {
	reps := max(o.Reps, 5)
	shapes := []gemmShape{
		{"256", 256, 256, 256},
		{"512", 512, 512, 512},
		{"1024", 1024, 1024, 1024},
		{"64x1024x4096", 64, 4096, 1024},
	}
	if o.Quick {
		shapes = []gemmShape{shapes[0], shapes[1], shapes[3]}
	}
	peak, peakNote := fp32Peak()
	o.Logf("gemm: backend %s, pure-Go kernel %s; peak %.0f GFLOP/s (%s)", tensor.Backend(), tensor.GoEngine().Name(), peak, peakNote)

	main := tensor.DefaultEngine()
	mainName := main.Name()
	if e, err := tensor.BLASEngine(); err == nil {
		main, mainName = e, "openblas"
	} else {
		o.Logf("gemm: %v; measuring %s against peak instead", err, mainName)
	}
	goEng := tensor.GoEngine()
	var gonum gonumblas.Implementation

	rng := rand.New(rand.NewPCG(1, 2))
	var rs []Result
	for _, s := range shapes {
		a := randomSlice(rng, s.m*s.k)
		b := randomSlice(rng, s.k*s.n)
		cMain := make([]float32, s.m*s.n)
		cGo := make([]float32, s.m*s.n)
		cGonum := make([]float32, s.m*s.n)
		flops := 2 * float64(s.m) * float64(s.n) * float64(s.k)

		runMain := func() { main.Gemm(false, false, s.m, s.n, s.k, 1, a, s.k, b, s.n, 0, cMain, s.n) }
		runGo := func() { goEng.Gemm(false, false, s.m, s.n, s.k, 1, a, s.k, b, s.n, 0, cGo, s.n) }
		runGonum := func() {
			gonum.Sgemm(blas.NoTrans, blas.NoTrans, s.m, s.n, s.k, 1, a, s.k, b, s.n, 0, cGonum, s.n)
		}

		tMain, _, err := TimeAlternating(ctx, reps, 2, runMain, nil)
		if err != nil {
			return nil, err
		}
		tGo, tGonum, err := TimeAlternating(ctx, reps, 1, runGo, runGonum)
		if err != nil {
			return nil, err
		}

		// The three results must agree, or the speeds mean nothing.
		if d := maxRelDiff(cGo, cGonum); d > 1e-3 {
			return nil, fmt.Errorf("gemm %s: pure-Go and gonum results differ (max relative diff %g)", s.name, d)
		}
		if d := maxRelDiff(cMain, cGonum); d > 1e-3 {
			return nil, fmt.Errorf("gemm %s: %s and gonum results differ (max relative diff %g)", s.name, mainName, d)
		}

		sm, sg, sn := gflops(flops, tMain), gflops(flops, tGo), gflops(flops, tGonum)
		rs = append(rs,
			Result{Suite: "gemm", Case: s.name, Metric: "gflops", Value: sm.Median, Unit: "GFLOP/s", Min: sm.Min, Max: sm.Max,
				Note: mainName + "; peak " + peakNote}.WithBaseline("peak", peak),
			Result{Suite: "gemm", Case: s.name + "/go", Metric: "gflops", Value: sg.Median, Unit: "GFLOP/s", Min: sg.Min, Max: sg.Max,
				Note: fmt.Sprintf("pure-Go %s vs gonum Sgemm, alternating; gonum min..max %.3g..%.3g", goEng.Name(), sn.Min, sn.Max)}.WithBaseline("gonum", sn.Median),
		)
		o.Logf("gemm %s: %s %.1f, go %.1f, gonum %.1f GFLOP/s", s.name, mainName, sm.Median, sg.Median, sn.Median)
	}
	return rs, nil
}

// gflops converts durations in seconds into GFLOP/s statistics (the
// median of rates is the rate of the median time for odd counts).
func gflops(flops float64, secs []float64) Stats {
	rates := make([]float64, len(secs))
	for i, s := range secs {
		rates[i] = flops / s / 1e9
	}
	return Summarize(rates)
}

func randomSlice(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	tensor.FillUniform(x, rng, -1, 1)
	return x
}

// maxRelDiff returns max |x-y| / (1 + max |y|) over the slices.
func maxRelDiff(x, y []float32) float64 {
	var d, scale float64
	for i := range y {
		d = max(d, math.Abs(float64(x[i]-y[i])))
		scale = max(scale, math.Abs(float64(y[i])))
	}
	return d / (1 + scale)
}

// fp32Peak estimates the machine's single-precision FMA peak in GFLOP/s as
// cores × GHz × 2 FMA units × lanes × 2 flops, with 16 lanes when the CPU
// has AVX-512 and 8 with AVX2. The clock is the highest "cpu MHz" in
// /proc/cpuinfo, which is the base clock on many VMs, so turbo can push
// measured rates above this estimate. When the clock is not readable it
// falls back to 2.6 GHz, the clock of the machine the suite was written on.
// The second result says which.
func fp32Peak() (float64, string) {
	lanes, isa := 8.0, "AVX2"
	switch {
	case cpu.X86.HasAVX512F:
		lanes, isa = 16, "AVX-512"
	case !cpu.X86.HasAVX2:
		lanes, isa = 4, "SSE/NEON (assumed)"
	}
	cores := float64(runtime.GOMAXPROCS(0))
	ghz, src := cpuinfoGHz()
	if ghz == 0 {
		ghz, src = 2.6, "assumed 2.6 GHz (no /proc/cpuinfo clock)"
	}
	peak := cores * ghz * 2 * lanes * 2
	return peak, fmt.Sprintf("est. %.0f GFLOP/s = %.0f cores × %.2f GHz (%s) × 2 FMA × %.0f lanes (%s) × 2", peak, cores, ghz, src, lanes, isa)
}

// cpuinfoGHz returns the highest "cpu MHz" in /proc/cpuinfo in GHz, or 0.
func cpuinfoGHz() (float64, string) {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0, ""
	}
	defer f.Close()
	var mhz float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		if x, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
			mhz = max(mhz, x)
		}
	}
	if mhz == 0 {
		return 0, ""
	}
	return mhz / 1000, "/proc/cpuinfo"
}
