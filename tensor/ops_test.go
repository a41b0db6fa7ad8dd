package tensor

import (
	"math"
	"math/rand/v2"
	"testing"
)

// lengths covers the empty slice, the unrolled body and every tail length.
var lengths = []int{0, 1, 2, 3, 4, 5, 7, 8, 9, 31, 64, 101}

func close32(got, want, tol float64) bool {
	return math.Abs(got-want) <= tol*(1+math.Abs(want))
}

func TestBinaryKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	ops := []struct {
		name string
		f    func(dst, a, b []float32)
		ref  func(a, b float32) float32
	}{
		{"Add", Add, func(a, b float32) float32 { return a + b }},
		{"Sub", Sub, func(a, b float32) float32 { return a - b }},
		{"Mul", Mul, func(a, b float32) float32 { return a * b }},
	}
	for _, op := range ops {
		for _, n := range lengths {
			a, b := randSlice(rng, n), randSlice(rng, n+3) // b may be longer
			dst := make([]float32, n)
			op.f(dst, a, b)
			for i := range dst {
				if want := op.ref(a[i], b[i]); dst[i] != want {
					t.Fatalf("%s n=%d: dst[%d] = %v, want %v", op.name, n, i, dst[i], want)
				}
			}
			// In place: dst aliases a.
			a2 := append([]float32(nil), a...)
			op.f(a2, a2, b)
			for i := range a2 {
				if a2[i] != dst[i] {
					t.Fatalf("%s n=%d in place differs at %d", op.name, n, i)
				}
			}
		}
	}
}

func TestShortSlicePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Add with a short operand did not panic")
		}
	}()
	Add(make([]float32, 5), make([]float32, 5), make([]float32, 4))
}

func TestScaleAddScalarAxpyFillCopy(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for _, n := range lengths {
		x := randSlice(rng, n)
		y := randSlice(rng, n)
		s := append([]float32(nil), x...)
		Scale(-1.5, s)
		as := append([]float32(nil), x...)
		AddScalar(0.25, as)
		ax := append([]float32(nil), y...)
		Axpy(2, x, ax)
		for i := range x {
			if s[i] != -1.5*x[i] || as[i] != x[i]+0.25 || ax[i] != y[i]+2*x[i] {
				t.Fatalf("n=%d i=%d: Scale %v AddScalar %v Axpy %v", n, i, s[i], as[i], ax[i])
			}
		}
		f := make([]float32, n)
		Fill(f, 3)
		for _, v := range f {
			if v != 3 {
				t.Fatalf("Fill: %v", f)
			}
		}
		Fill(f, 0)
		Copy(f, x)
		for i := range f {
			if f[i] != x[i] {
				t.Fatalf("Copy: %v vs %v", f, x)
			}
		}
	}
}

func TestReductions(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for _, n := range lengths {
		x, y := randSlice(rng, n), randSlice(rng, n)
		var dot, sum float64
		mx := math.Inf(-1)
		for i := range x {
			dot += float64(x[i]) * float64(y[i])
			sum += float64(x[i])
			mx = math.Max(mx, float64(x[i]))
		}
		if got := Dot(x, y); !close32(float64(got), dot, 1e-5) {
			t.Errorf("Dot n=%d = %v, want %v", n, got, dot)
		}
		if got := Sum(x); !close32(float64(got), sum, 1e-5) {
			t.Errorf("Sum n=%d = %v, want %v", n, got, sum)
		}
		if got := Max(x); float64(got) != mx {
			t.Errorf("Max n=%d = %v, want %v", n, got, mx)
		}
	}
	if m := Max([]float32{1, float32(math.NaN()), 3}); m == m {
		t.Errorf("Max with NaN = %v, want NaN", m)
	}
}

func TestReLU(t *testing.T) {
	x := []float32{-2, -0.5, 0, 0.5, 3, float32(math.NaN())}
	y := make([]float32, len(x))
	ReLU(y, x)
	want := []float32{0, 0, 0, 0.5, 3, 0}
	dy := []float32{1, 2, 3, 4, 5, 6}
	dx := make([]float32, len(x))
	ReLUBackward(dx, x, dy)
	wantDx := []float32{0, 0, 0, 4, 5, 0}
	for i := range x {
		if y[i] != want[i] || dx[i] != wantDx[i] {
			t.Fatalf("ReLU = %v, want %v; backward = %v, want %v", y, want, dx, wantDx)
		}
	}
}

func TestExp(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	xs := []float32{0, 1, -1, 0.5, 88.7, -87, -100, -103.9, 80, 1e-8, -1e-8}
	for i := 0; i < 20000; i++ {
		xs = append(xs, float32(rng.Float64()*200-100))
	}
	got := make([]float32, len(xs))
	Exp(got, xs)
	for i, x := range xs {
		want := math.Exp(float64(x))
		g := float64(got[i])
		if want > math.MaxFloat32 {
			if !math.IsInf(g, 1) {
				t.Fatalf("exp(%v) = %v, want +Inf", x, g)
			}
			continue
		}
		if want < 1.2e-38 { // subnormal results: compare absolutely
			if math.Abs(g-want) > 2e-45*4 {
				t.Fatalf("exp(%v) = %v, want %v", x, g, want)
			}
			continue
		}
		if rel := math.Abs(g-want) / want; rel > 3e-7 {
			t.Fatalf("exp(%v) = %v, want %v (rel err %g)", x, g, want, rel)
		}
	}
	// Special values, tiled so that both the vector and the scalar path see
	// them.
	special := []float32{89, float32(math.Inf(1)), -104, float32(math.Inf(-1)), float32(math.NaN())}
	var in []float32
	for len(in) < 21 {
		in = append(in, special...)
	}
	out := make([]float32, len(in))
	Exp(out, in)
	for i := 0; i < len(in); i += len(special) {
		o := out[i:min(i+len(special), len(out))]
		for j, v := range o {
			ok := false
			switch j {
			case 0, 1:
				ok = math.IsInf(float64(v), 1)
			case 2, 3:
				ok = v == 0
			case 4:
				ok = v != v
			}
			if !ok {
				t.Fatalf("exp(%v) = %v", special[j], v)
			}
		}
	}
}

func TestSoftmaxRows(t *testing.T) {
	rows, cols := 3, 5
	x := []float32{
		1, 2, 3, 4, 5,
		1000, 1001, 1002, 1003, 1004, // would overflow without the max shift
		-3, 0, 0, 7, float32(math.Inf(-1)),
	}
	ls := append([]float32(nil), x...)
	SoftmaxRows(x, rows, cols)
	LogSoftmaxRows(ls, rows, cols)
	src := [][]float64{{1, 2, 3, 4, 5}, {0, 1, 2, 3, 4}, {-3, 0, 0, 7, math.Inf(-1)}}
	for r, row := range src {
		var s float64
		for _, v := range row {
			s += math.Exp(v - 7)
		}
		for c, v := range row {
			want := math.Exp(v-7) / s
			if got := x[r*cols+c]; !close32(float64(got), want, 1e-6) {
				t.Errorf("softmax[%d,%d] = %v, want %v", r, c, got, want)
			}
			wantLog := v - 7 - math.Log(s)
			if got := ls[r*cols+c]; !(math.IsInf(wantLog, -1) && math.IsInf(float64(got), -1)) && !close32(float64(got), wantLog, 1e-6) {
				t.Errorf("logsoftmax[%d,%d] = %v, want %v", r, c, got, wantLog)
			}
		}
	}
}

// geluRef is the BERT formula evaluated in float64 with math.Tanh.
func geluRef(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(geluC*(x+geluA*x*x*x)))
}

func TestGELU(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	x := []float32{0, 1, -1, 10, -10, 30, -30, 1e-4}
	for i := 0; i < 1000; i++ {
		x = append(x, float32(rng.NormFloat64()*3))
	}
	dy := randSlice(rng, len(x))
	y := make([]float32, len(x))
	dx := make([]float32, len(x))
	GELU(y, x)
	GELUBackward(dx, x, dy)
	for i, v := range x {
		xv := float64(v)
		if want := geluRef(xv); math.Abs(float64(y[i])-want) > 1e-6*(1+math.Abs(want)) {
			t.Fatalf("GELU(%v) = %v, want %v", v, y[i], want)
		}
		// Central difference of the float64 reference.
		h := 1e-5 * math.Max(1, math.Abs(xv))
		deriv := (geluRef(xv+h) - geluRef(xv-h)) / (2 * h)
		if want := float64(dy[i]) * deriv; math.Abs(float64(dx[i])-want) > 1e-5 {
			t.Fatalf("GELUBackward(%v) = %v, want %v", v, dx[i], want)
		}
	}
}

func TestRowColKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	for _, sh := range [][2]int{{0, 3}, {1, 1}, {3, 5}, {7, 33}, {4, 0}} {
		rows, cols := sh[0], sh[1]
		x := randSlice(rng, rows*cols)
		// Shift the values so that a naive one-pass variance would lose
		// precision.
		AddScalar(100, x)
		bias := randSlice(rng, cols)

		xb := append([]float32(nil), x...)
		AddRowVector(xb, bias, rows, cols)
		cs := make([]float32, cols)
		Fill(cs, 42) // must be overwritten
		ColSums(cs, x, rows, cols)
		mean, variance := make([]float32, rows), make([]float32, rows)
		MeanVarRows(mean, variance, x, rows, cols)
		tr := make([]float32, rows*cols)
		Transpose2D(tr, x, rows, cols)

		for c := 0; c < cols; c++ {
			var s float64
			for r := 0; r < rows; r++ {
				s += float64(x[r*cols+c])
				if xb[r*cols+c] != x[r*cols+c]+bias[c] {
					t.Fatalf("AddRowVector %dx%d at %d,%d", rows, cols, r, c)
				}
				if tr[c*rows+r] != x[r*cols+c] {
					t.Fatalf("Transpose2D %dx%d at %d,%d", rows, cols, r, c)
				}
			}
			if !close32(float64(cs[c]), s, 1e-6) {
				t.Fatalf("ColSums %dx%d [%d] = %v, want %v", rows, cols, c, cs[c], s)
			}
		}
		for r := 0; r < rows; r++ {
			var mu, v float64
			for c := 0; c < cols; c++ {
				mu += float64(x[r*cols+c])
			}
			if cols > 0 {
				mu /= float64(cols)
			}
			for c := 0; c < cols; c++ {
				d := float64(x[r*cols+c]) - mu
				v += d * d
			}
			if cols > 0 {
				v /= float64(cols)
			}
			if !close32(float64(mean[r]), mu, 1e-6) || math.Abs(float64(variance[r])-v) > 1e-4*(v+1e-3) {
				t.Fatalf("MeanVarRows %dx%d row %d = %v, %v; want %v, %v", rows, cols, r, mean[r], variance[r], mu, v)
			}
		}
	}
}

func TestTransposeLarge(t *testing.T) {
	rows, cols := 70, 45 // crosses tile borders
	x := make([]float32, rows*cols)
	for i := range x {
		x[i] = float32(i)
	}
	tr := make([]float32, rows*cols)
	back := make([]float32, rows*cols)
	Transpose2D(tr, x, rows, cols)
	Transpose2D(back, tr, cols, rows)
	for i := range x {
		if back[i] != x[i] {
			t.Fatalf("transpose twice differs at %d", i)
		}
	}
}

func TestFillRandom(t *testing.T) {
	const n = 200000
	x := make([]float32, n)
	FillNormal(x, rand.New(rand.NewPCG(7, 7)), 2, 0.5)
	var mu, v float64
	for _, e := range x {
		mu += float64(e)
	}
	mu /= n
	for _, e := range x {
		v += (float64(e) - mu) * (float64(e) - mu)
	}
	sd := math.Sqrt(v / n)
	if math.Abs(mu-2) > 0.01 || math.Abs(sd-0.5) > 0.01 {
		t.Fatalf("FillNormal mean %v sd %v, want 2, 0.5", mu, sd)
	}
	y := make([]float32, n)
	FillNormal(y, rand.New(rand.NewPCG(7, 7)), 2, 0.5)
	for i := range x {
		if x[i] != y[i] {
			t.Fatal("FillNormal is not reproducible from the seed")
		}
	}
	FillUniform(x, rand.New(rand.NewPCG(8, 8)), -3, 5)
	lo, hi := float32(5), float32(-3)
	for _, e := range x {
		if e < -3 || e >= 5 {
			t.Fatalf("FillUniform value %v outside [-3, 5)", e)
		}
		lo, hi = min(lo, e), max(hi, e)
	}
	if lo > -2.99 || hi < 4.99 {
		t.Fatalf("FillUniform range [%v, %v] does not cover [-3, 5)", lo, hi)
	}
}
