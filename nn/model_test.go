package nn

import (
	"maps"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/tensor"
)

func tinyBERT(t *testing.T, seed uint64) *Sequential {
	t.Helper()
	m, err := BERTClassifier(BERTConfig{Vocab: 11, Seq: 5, Hidden: 8, Heads: 2, Layers: 2, FFN: 16, Dropout: 0.2, Classes: 3}, newRNG(seed))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func tokens() *tensor.Tensor {
	return tensor.FromSlice([]float32{1, 4, 7, 0, 0, 2, 3, 10, 9, 5}, 2, 5)
}

func grads(ps []*Param) map[string][]float32 {
	out := map[string][]float32{}
	for _, p := range ps {
		out[p.Name] = slices.Clone(p.Grad.Data)
	}
	return out
}

func assertClose(t *testing.T, what string, a, b []float32, tol float64) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: lengths %d and %d", what, len(a), len(b))
	}
	for i := range a {
		if math.Abs(float64(a[i]-b[i])) > tol*(1+math.Abs(float64(a[i]))) {
			t.Fatalf("%s[%d]: %v vs %v", what, i, a[i], b[i])
		}
	}
}

// Two Forward calls in flight, then their Backward calls, give the same
// gradients as running each pair back to back.
func TestStateIsolation(t *testing.T) {
	x1, x2 := tokens(), tensor.FromSlice([]float32{3, 3, 1, 8, 6, 0, 2, 2, 9, 1}, 2, 5)
	c1 := Ctx{Train: true, Mask: testMask()}
	c2 := Ctx{Train: true}
	dy := randTensor(newRNG(3), 1, 2, 3)

	seq := tinyBERT(t, 1)
	y1, s1 := seq.Forward(c1, x1)
	seq.Backward(s1, dy)
	y2, s2 := seq.Forward(c2, x2)
	seq.Backward(s2, dy)
	want := grads(seq.Params())

	inter := tinyBERT(t, 1)
	z1, t1 := inter.Forward(c1, x1)
	z2, t2 := inter.Forward(c2, x2)
	inter.Backward(t2, dy)
	inter.Backward(t1, dy)
	got := grads(inter.Params())

	assertClose(t, "y1", y1.Data, z1.Data, 1e-6)
	assertClose(t, "y2", y2.Data, z2.Data, 1e-6)
	for name, g := range want {
		assertClose(t, name, g, got[name], 1e-5)
	}
}

// Running Slice(0,k) then Slice(k,n) equals running the whole model, for
// every split point, and the slices name their parameters as the model does.
func TestSliceEquivalence(t *testing.T) {
	m := tinyBERT(t, 2)
	c := Ctx{Mask: testMask()}
	x := tokens()
	dy := randTensor(newRNG(4), 1, 2, 3)
	y, st := m.Forward(c, x)
	m.Backward(st, dy)
	want := grads(m.Params())

	for k := 1; k < m.Len(); k++ {
		ZeroGrad(m.Params())
		a, b := m.Slice(0, k), m.Slice(k, m.Len())
		h, sa := a.Forward(c, x)
		z, sb := b.Forward(c, h)
		assertClose(t, "output", y.Data, z.Data, 1e-6)
		dh := b.Backward(sb, dy)
		if dx := a.Backward(sa, dh); dx != nil {
			t.Fatal("token model returned an input gradient")
		}
		names := append(paramNames(a), paramNames(b)...)
		if !slices.Equal(names, paramNames(m)) {
			t.Fatalf("split %d: slice names %v differ from model names %v", k, names, paramNames(m))
		}
		got := grads(append(a.Params(), b.Params()...))
		for name, g := range want {
			assertClose(t, name, g, got[name], 1e-5)
		}
	}
	// Slicing a slice keeps global indices.
	if got := m.Slice(2, 6).Slice(2, 3).Params()[0].Name; !strings.HasPrefix(got, "4.enc.") {
		t.Errorf("nested slice parameter %q, want prefix 4.enc.", got)
	}
}

func paramNames(m Module) []string {
	var out []string
	for _, p := range m.Params() {
		out = append(out, p.Name)
	}
	return out
}

func TestParamNamesUnique(t *testing.T) {
	m := tinyBERT(t, 3)
	names := paramNames(m)
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			t.Errorf("duplicate name %q", n)
		}
		seen[n] = true
	}
	for _, want := range []string{"0.embed.weight", "4.enc.attn.wq.weight", "5.enc.ffn.fc2.bias", "5.enc.ln2.gamma", "7.head.weight"} {
		if !seen[want] {
			t.Errorf("missing parameter %q in %v", want, names)
		}
	}
	if !slices.Equal(names, paramNames(tinyBERT(t, 4))) {
		t.Error("parameter names are not stable across builds")
	}
}

func TestExportImport(t *testing.T) {
	a, b := tinyBERT(t, 5), tinyBERT(t, 6)
	exp := ExportParams(a.Params())
	if err := ImportParams(b.Params(), exp); err != nil {
		t.Fatal(err)
	}
	ya, _ := a.Forward(Ctx{}, tokens())
	yb, _ := b.Forward(Ctx{}, tokens())
	assertClose(t, "imported model output", ya.Data, yb.Data, 0)
	// Export is a copy.
	exp["7.head.bias"].Data[0] = 42
	if a.Params()[len(a.Params())-1].Value.Data[0] == 42 {
		t.Error("ExportParams shares memory with the model")
	}

	// A stage gets exactly its own weights.
	stage := b.Slice(4, 6)
	if err := ImportParams(stage.Params(), FilterParams(stage.Params(), exp)); err != nil {
		t.Fatal(err)
	}

	bad := maps.Clone(exp)
	delete(bad, "4.enc.ln1.beta")
	if err := ImportParams(b.Params(), bad); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing parameter: err = %v", err)
	}
	bad = maps.Clone(exp)
	bad["4.enc.ln1.beta"] = tensor.New(9)
	if err := ImportParams(b.Params(), bad); err == nil || !strings.Contains(err.Error(), "shape") {
		t.Errorf("wrong shape: err = %v", err)
	}
	bad = maps.Clone(exp)
	bad["99.bogus"] = tensor.New(1)
	if err := ImportParams(b.Params(), bad); err == nil || !strings.Contains(err.Error(), "99.bogus") {
		t.Errorf("unknown parameter: err = %v", err)
	}
	before := b.Params()[0].Value.Data[0]
	bad = maps.Clone(exp)
	bad["0.embed.weight"] = exp["0.embed.weight"].Clone()
	bad["0.embed.weight"].Data[0] = before + 1
	bad["7.head.bias"] = tensor.New(7)
	if err := ImportParams(b.Params(), bad); err == nil {
		t.Error("expected error")
	} else if b.Params()[0].Value.Data[0] != before {
		t.Error("failed import modified the model")
	}
}

func TestCost(t *testing.T) {
	l := NewLinear(3, 5, 1, newRNG(1))
	c := l.Cost([]int{2, 4, 3})
	if c.ForwardFLOPs < 2*8*3*5 || c.BackwardFLOPs < 2*2*8*3*5 || c.Params != 20 || !slices.Equal(c.OutShape, []int{2, 4, 5}) {
		t.Errorf("linear cost %+v", c)
	}
	cfg := BERTLarge()
	e := NewEncoderLayer(64, 4, 256, 0.1, newRNG(1))
	ec := e.Cost([]int{2, 16, 64})
	if ec.Params != NumParams(e.Params()) {
		t.Errorf("encoder cost params %d, counted %d", ec.Params, NumParams(e.Params()))
	}
	// GEMM FLOPs of a BERT layer: 24·B·S·H² (projections and FFN with 4H)
	// plus 4·B·S²·H (attention), forward.
	b, s, h := 2.0, 16.0, 64.0
	gemm := 2*b*s*h*h*4 + 2*2*b*s*h*256 + 4*b*s*s*h
	if ec.ForwardFLOPs < gemm || ec.ForwardFLOPs > 1.1*gemm {
		t.Errorf("encoder forward FLOPs %g, GEMM part %g", ec.ForwardFLOPs, gemm)
	}
	for _, m := range []*Sequential{tinyBERT(t, 1), MLP([]int{12, 6, 3}, 0.1, newRNG(1))} {
		in := []int{2, 5}
		if m.Len() == 4 {
			in = []int{2, 12}
		}
		x := tensor.New(in...)
		y, _ := m.Forward(Ctx{}, x)
		c := m.Cost(in)
		if !slices.Equal(c.OutShape, y.Shape) || c.Params != NumParams(m.Params()) {
			t.Errorf("cost %+v vs output %v, %d params", c, y.Shape, NumParams(m.Params()))
		}
		lc := m.LayerCosts(in)
		if len(lc) != m.Len() {
			t.Errorf("%d layer costs for %d layers", len(lc), m.Len())
		}
	}
	if cfg.Hidden != 1024 || cfg.Heads != 16 || cfg.FFN != 4096 || cfg.Seq != 128 {
		t.Errorf("BERT-large config %+v", cfg)
	}
}

func TestImageBERTTinyBuilds(t *testing.T) {
	m, err := ImageBERT(ImageBERTTiny(), newRNG(1))
	if err != nil {
		t.Fatal(err)
	}
	y, _ := m.Forward(Ctx{Train: true}, randTensor(newRNG(2), 1, 3, 784))
	if !slices.Equal(y.Shape, []int{3, 10}) {
		t.Fatalf("output %v", y.Shape)
	}
	if _, err := BERTEncoder(BERTConfig{Seq: 4, Hidden: 10, Heads: 3, Layers: 1, FFN: 4}, newRNG(1)); err == nil {
		t.Error("hidden not divisible by heads accepted")
	}
}

func fromRow(data []float32, shape ...int) *tensor.Tensor {
	return tensor.FromSlice(slices.Clone(data), shape...)
}
