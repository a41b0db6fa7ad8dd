package optim

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
)

func param(name string, vals ...float32) *nn.Param {
	return &nn.Param{Name: name, Value: tensor.FromSlice(vals, len(vals)), Grad: tensor.New(len(vals))}
}

func near(t *testing.T, what string, got float32, want float64) {
	t.Helper()
	if math.Abs(float64(got)-want) > 1e-6*(1+math.Abs(want)) {
		t.Errorf("%s = %.8g, want %.8g", what, got, want)
	}
}

func TestSGDMomentum(t *testing.T) {
	p := param("w", 1)
	o := NewSGD([]*nn.Param{p}, SGDConfig{LR: 0.1, Momentum: 0.9, WeightDecay: 0.1})
	p.Grad.Data[0] = 0.5
	o.Step()
	// g = 0.5 + 0.1·1 = 0.6; v = 0.6; w = 1 − 0.06.
	near(t, "w1", p.Value.Data[0], 0.94)
	o.Step()
	// g = 0.5 + 0.094 = 0.594; v = 0.54 + 0.594 = 1.134; w = 0.94 − 0.1134.
	near(t, "w2", p.Value.Data[0], 0.8266)

	q := param("w", 1)
	n := NewSGD([]*nn.Param{q}, SGDConfig{LR: 0.1, Momentum: 0.9, Nesterov: true})
	q.Grad.Data[0] = 0.5
	n.Step()
	// v = 0.5; step g + μv = 0.95.
	near(t, "nesterov w1", q.Value.Data[0], 0.905)
	n.Step()
	// v = 0.45 + 0.5 = 0.95; step 0.5 + 0.855 = 1.355.
	near(t, "nesterov w2", q.Value.Data[0], 0.905-0.1355)

	r := param("w", 2)
	plain := NewSGD([]*nn.Param{r}, SGDConfig{LR: 0.5})
	r.Grad.Data[0] = 1
	plain.Step()
	near(t, "plain sgd", r.Value.Data[0], 1.5)
}

func TestAdamW(t *testing.T) {
	p := param("w", 1, -2)
	o := NewAdamW([]*nn.Param{p}, AdamWConfig{LR: 0.01, WeightDecay: 0.1})
	grads := [][2]float64{{0.5, -1}, {0.1, 2}, {-0.3, 0.2}}
	// Reference in float64.
	w := []float64{1, -2}
	m := []float64{0, 0}
	v := []float64{0, 0}
	for step, g := range grads {
		p.Grad.Data[0], p.Grad.Data[1] = float32(g[0]), float32(g[1])
		o.Step()
		tt := float64(step + 1)
		for j := range w {
			w[j] *= 1 - 0.01*0.1
			m[j] = 0.9*m[j] + 0.1*g[j]
			v[j] = 0.999*v[j] + 0.001*g[j]*g[j]
			mh := m[j] / (1 - math.Pow(0.9, tt))
			vh := v[j] / (1 - math.Pow(0.999, tt))
			w[j] -= 0.01 * mh / (math.Sqrt(vh) + 1e-8)
		}
		near(t, "w0", p.Value.Data[0], w[0])
		near(t, "w1", p.Value.Data[1], w[1])
		if step == 0 {
			// By hand: the first step moves each weight by lr·sign(g)
			// after decay: 1·0.999 − 0.01 and −2·0.999 + 0.01.
			near(t, "first step w0", p.Value.Data[0], 0.989)
			near(t, "first step w1", p.Value.Data[1], -1.988)
		}
	}

	// NoDecay exempts vectors.
	b := param("bias", 1)
	o2 := NewAdamW([]*nn.Param{b}, AdamWConfig{LR: 0.1, WeightDecay: 1, NoDecay: NoDecayVectors})
	o2.Step() // zero gradient: no Adam move, and no decay for a vector
	near(t, "undecayed bias", b.Value.Data[0], 1)
}

func TestClipGradNorm(t *testing.T) {
	a, b := param("a", 0, 0), param("b", 0)
	a.Grad.Data[0], a.Grad.Data[1], b.Grad.Data[0] = 3, 0, 4
	ps := []*nn.Param{a, b}
	if n := ClipGradNorm(ps, 10); n != 5 {
		t.Errorf("norm %v, want 5", n)
	}
	near(t, "unclipped", a.Grad.Data[0], 3)
	if n := ClipGradNorm(ps, 1); n != 5 {
		t.Errorf("norm %v, want 5", n)
	}
	near(t, "clipped a", a.Grad.Data[0], 0.6)
	near(t, "clipped b", b.Grad.Data[0], 0.8)
	if n := ClipGradNorm(ps, 1); math.Abs(n-1) > 1e-6 {
		t.Errorf("norm after clipping %v, want 1", n)
	}
}

func TestSchedule(t *testing.T) {
	s := Schedule{Peak: 1, Min: 0.1, Warmup: 4, Total: 14, Decay: Linear}
	for _, c := range []struct {
		step int64
		want float64
	}{{0, 0.25}, {3, 1}, {4, 1}, {9, 0.55}, {14, 0.1}, {100, 0.1}} {
		if got := s.LR(c.step); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("linear LR(%d) = %v, want %v", c.step, got, c.want)
		}
	}
	s.Decay = Cosine
	if got := s.LR(9); math.Abs(got-0.55) > 1e-12 {
		t.Errorf("cosine midpoint %v, want 0.55", got)
	}
	if got := s.LR(6); got <= s.LR(7) || got >= 1 {
		t.Errorf("cosine not decreasing: %v, %v", got, s.LR(7))
	}
	s.Decay = Constant
	if s.LR(1000) != 1 {
		t.Errorf("constant LR %v", s.LR(1000))
	}
}

// randomGrads fills the gradients from a seeded stream.
func randomGrads(ps []*nn.Param, rng *rand.Rand) {
	for _, p := range ps {
		tensor.FillNormal(p.Grad.Data, rng, 0, 1)
	}
}

func TestStateRoundTrip(t *testing.T) {
	for _, mk := range []func([]*nn.Param) Optimizer{
		func(ps []*nn.Param) Optimizer { return NewAdamW(ps, AdamWConfig{LR: 1e-2, WeightDecay: 0.01}) },
		func(ps []*nn.Param) Optimizer {
			return NewSGD(ps, SGDConfig{LR: 1e-2, Momentum: 0.9, Nesterov: true})
		},
	} {
		a := nn.MLP([]int{4, 6, 3}, 0, rand.New(rand.NewPCG(1, 2)))
		oa := mk(a.Params())
		rng := rand.New(rand.NewPCG(3, 4))
		for range 3 {
			randomGrads(a.Params(), rng)
			oa.Step()
		}
		// Move weights and optimizer state to a fresh process.
		b := nn.MLP([]int{4, 6, 3}, 0, rand.New(rand.NewPCG(9, 9)))
		ob := mk(b.Params())
		if err := nn.ImportParams(b.Params(), nn.ExportParams(a.Params())); err != nil {
			t.Fatal(err)
		}
		st := oa.State()
		if err := ob.LoadState(st); err != nil {
			t.Fatal(err)
		}
		if ob.State().Step != 3 {
			t.Fatalf("step %d after load", ob.State().Step)
		}
		for range 3 {
			seed := rng.Uint64()
			randomGrads(a.Params(), rand.New(rand.NewPCG(seed, 0)))
			randomGrads(b.Params(), rand.New(rand.NewPCG(seed, 0)))
			oa.Step()
			ob.Step()
		}
		pa, pb := a.Params(), b.Params()
		for i := range pa {
			for j := range pa[i].Value.Data {
				if pa[i].Value.Data[j] != pb[i].Value.Data[j] {
					t.Fatalf("%s[%d] diverged after import: %v vs %v", pa[i].Name, j, pa[i].Value.Data[j], pb[i].Value.Data[j])
				}
			}
		}

		// Stage-wise split and merge give back the same state.
		s0 := oa.State().Filter(a.Slice(0, 1).Params())
		s1 := oa.State().Filter(a.Slice(1, a.Len()).Params())
		merged, err := Merge(s0, s1)
		if err != nil {
			t.Fatal(err)
		}
		if len(merged.Tensors) != len(oa.State().Tensors) {
			t.Errorf("merged %d tensors, want %d", len(merged.Tensors), len(oa.State().Tensors))
		}
		if err := ob.LoadState(merged); err != nil {
			t.Fatal(err)
		}

		// Validation.
		bad := oa.State()
		for name := range bad.Tensors {
			bad.Tensors[name] = tensor.New(1, 1, 1)
			break
		}
		if err := ob.LoadState(bad); err == nil || !strings.Contains(err.Error(), "shape") {
			t.Errorf("bad shape: %v", err)
		}
		bad = oa.State()
		bad.Tensors["nope.m"] = tensor.New(1)
		if err := ob.LoadState(bad); err == nil || !strings.Contains(err.Error(), "unknown") {
			t.Errorf("unknown tensor: %v", err)
		}
		if err := ob.LoadState(s0); err == nil || !strings.Contains(err.Error(), "lacks") {
			t.Errorf("partial state: %v", err)
		}
	}
}

// An MLP trained with AdamW and a schedule learns a separable problem.
func TestTrainMLP(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n, d, classes = 256, 8, 3
	centers := tensor.New(classes, d)
	tensor.FillNormal(centers.Data, rng, 0, 2)
	x := tensor.New(n, d)
	labels := make([]int, n)
	for i := range labels {
		labels[i] = rng.IntN(classes)
		for j := 0; j < d; j++ {
			x.Data[i*d+j] = centers.Data[labels[i]*d+j] + float32(rng.NormFloat64())
		}
	}
	m := nn.MLP([]int{d, 32, classes}, 0.1, rng)
	o := NewAdamW(m.Params(), AdamWConfig{LR: 1e-2, WeightDecay: 1e-4, NoDecay: NoDecayVectors})
	sched := Schedule{Peak: 1e-2, Min: 1e-4, Warmup: 10, Total: 150, Decay: Cosine}
	var first, last float32
	for step := range int64(150) {
		o.ZeroGrad()
		y, st := m.Forward(nn.Ctx{Train: true}, x)
		loss, dy := nn.SoftmaxCrossEntropy(y, labels)
		m.Backward(st, dy)
		ClipGradNorm(m.Params(), 5)
		o.SetLR(sched.LR(step))
		o.Step()
		if step == 0 {
			first = loss
		}
		last = loss
	}
	y, _ := m.Forward(nn.Ctx{}, x)
	if acc := nn.Accuracy(y, labels); acc < 0.9 || last > first/3 {
		t.Errorf("accuracy %v, loss %v → %v", acc, first, last)
	}
}
