package nn

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/skyhive/skyhive/tensor"
)

// Gradient checking against central finite differences.
//
// The scalar checked is L = Σ y·r for a fixed random r, so Backward is called
// with dy = r. L is accumulated in float64 from the float32 outputs. The
// step is h = 1e-2·max(1, |v|): with float32 forward passes the rounding
// error of (L(v+h) − L(v−h))/2h is about 1e-7·Σ|y·r|/h, and the truncation
// error is O(h²·L'''), so both stay near 1e-4 on these small problems. An
// analytic value a and numeric value n agree if |a − n| ≤ atol + rtol·max(|a|,
// |n|) with atol = 2e-3 and rtol = 2e-2: loose enough for float32, tight
// enough that a wrong term (typically off by O(1)) fails. Layers with kinks
// (ReLU) are fed inputs that stay away from them.

type gcOpts struct {
	// reset is called before every Forward (e.g. to replay dropout masks).
	reset func()
	// noInput skips the input gradient (Embedding).
	noInput bool
	// maxPerTensor caps the number of checked entries per tensor.
	maxPerTensor int
}

func randTensor(rng *rand.Rand, std float64, shape ...int) *tensor.Tensor {
	t := tensor.New(shape...)
	fillNormal(t.Data, rng, std)
	return t
}

func gradCheck(t *testing.T, m Module, c Ctx, x *tensor.Tensor, o gcOpts) {
	t.Helper()
	if o.maxPerTensor == 0 {
		o.maxPerTensor = 24
	}
	if o.reset == nil {
		o.reset = func() {}
	}
	rng := rand.New(rand.NewPCG(7, 7))
	o.reset()
	y, st := m.Forward(c, x)
	r := randTensor(rng, 1, y.Shape...)
	ps := m.Params()
	ZeroGrad(ps)
	dx := m.Backward(st, r.Clone())
	if !tensor.SameShape(y.Shape, m.Cost(x.Shape).OutShape) {
		t.Errorf("Cost OutShape %v, Forward gave %v", m.Cost(x.Shape).OutShape, y.Shape)
	}

	loss := func() float64 {
		o.reset()
		y, _ := m.Forward(c, x)
		var s float64
		for i, v := range y.Data {
			s += float64(v) * float64(r.Data[i])
		}
		return s
	}
	check := func(name string, v []float32, analytic []float32) {
		t.Helper()
		idx := rng.Perm(len(v))
		if len(idx) > o.maxPerTensor {
			idx = idx[:o.maxPerTensor]
		}
		bad := 0
		for _, i := range idx {
			old := v[i]
			h := 1e-2 * math.Max(1, math.Abs(float64(old)))
			v[i] = old + float32(h)
			lp := loss()
			v[i] = old - float32(h)
			lm := loss()
			v[i] = old
			num := (lp - lm) / (float64(old+float32(h)) - float64(old-float32(h)))
			a := float64(analytic[i])
			if math.Abs(a-num) > 2e-3+2e-2*math.Max(math.Abs(a), math.Abs(num)) {
				if bad < 5 {
					t.Errorf("%s[%d]: analytic %.6g, numeric %.6g", name, i, a, num)
				}
				bad++
			}
		}
	}
	if !o.noInput {
		if dx == nil || !tensor.SameShape(dx.Shape, x.Shape) {
			t.Fatalf("input gradient has shape %v, want %v", shapeOf(dx), x.Shape)
		}
		check("input", x.Data, dx.Data)
	}
	for _, p := range ps {
		check(p.Name, p.Value.Data, p.Grad.Data)
	}
}

func shapeOf(t *tensor.Tensor) []int {
	if t == nil {
		return nil
	}
	return t.Shape
}

// awayFromZero pushes entries of x out of (−0.1, 0.1) so that finite
// differences do not cross a ReLU kink.
func awayFromZero(x *tensor.Tensor) {
	for i, v := range x.Data {
		if v >= 0 && v < 0.1 {
			x.Data[i] = v + 0.1
		} else if v < 0 && v > -0.1 {
			x.Data[i] = v - 0.1
		}
	}
}

func newRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

// resetDropout returns a hook that reseeds the given dropout layers.
func resetDropout(ds ...*Dropout) func() {
	return func() {
		for i, d := range ds {
			d.rng = rand.New(rand.NewPCG(uint64(i)+1, 99))
		}
	}
}

func testMask() *tensor.Tensor {
	// Two sequences of length 5: the first has 3 real tokens, the second 5.
	return tensor.FromSlice([]float32{1, 1, 1, 0, 0, 1, 1, 1, 1, 1}, 2, 5)
}

func TestGradLinear(t *testing.T) {
	rng := newRNG(1)
	l := NewLinear(6, 4, 0.5, rng)
	fillNormal(l.B.Value.Data, rng, 0.5)
	gradCheck(t, l, Ctx{}, randTensor(rng, 1, 2, 3, 6), gcOpts{})
}

func TestGradReLU(t *testing.T) {
	x := randTensor(newRNG(2), 1, 3, 7)
	awayFromZero(x)
	gradCheck(t, ReLU{}, Ctx{}, x, gcOpts{})
}

func TestGradGELU(t *testing.T) {
	gradCheck(t, GELU{}, Ctx{}, randTensor(newRNG(3), 2, 4, 9), gcOpts{})
}

func TestGELUValues(t *testing.T) {
	x := []float32{-3, -1, 0, 0.5, 2}
	y := make([]float32, len(x))
	tensor.GELU(y, x)
	for i, v := range x {
		u := math.Sqrt(2/math.Pi) * (float64(v) + 0.044715*math.Pow(float64(v), 3))
		want := 0.5 * float64(v) * (1 + math.Tanh(u))
		if math.Abs(float64(y[i])-want) > 2e-6 {
			t.Errorf("gelu(%v) = %v, want %v", v, y[i], want)
		}
	}
}

func TestGradLayerNorm(t *testing.T) {
	rng := newRNG(4)
	l := NewLayerNorm(8, 1e-5)
	fillNormal(l.Gamma.Value.Data, rng, 1)
	fillNormal(l.Beta.Value.Data, rng, 1)
	gradCheck(t, l, Ctx{}, randTensor(rng, 1, 2, 3, 8), gcOpts{})
}

func TestGradDropout(t *testing.T) {
	rng := newRNG(5)
	d := NewDropout(0.4, rng)
	gradCheck(t, d, Ctx{Train: true}, randTensor(rng, 1, 4, 6), gcOpts{reset: resetDropout(d)})
}

func TestDropout(t *testing.T) {
	rng := newRNG(6)
	d := NewDropout(0.3, rng)
	x := tensor.New(10000)
	for i := range x.Data {
		x.Data[i] = 1
	}
	y, _ := d.Forward(Ctx{}, x)
	if y != x {
		t.Error("dropout at inference should be the identity")
	}
	y, _ = d.Forward(Ctx{Train: true}, x)
	zeros, sum := 0, 0.0
	for _, v := range y.Data {
		if v == 0 {
			zeros++
		} else if math.Abs(float64(v)-1/0.7) > 1e-5 {
			t.Fatalf("kept value %v, want %v", v, 1/0.7)
		}
		sum += float64(v)
	}
	if zeros < 2700 || zeros > 3300 {
		t.Errorf("dropped %d of 10000, want about 3000", zeros)
	}
	if math.Abs(sum/10000-1) > 0.05 {
		t.Errorf("mean after dropout %v, want about 1", sum/10000)
	}
	// Same seed, same masks.
	a, b := NewDropout(0.3, newRNG(9)), NewDropout(0.3, newRNG(9))
	ya, _ := a.Forward(Ctx{Train: true}, x)
	yb, _ := b.Forward(Ctx{Train: true}, x)
	for i := range ya.Data {
		if ya.Data[i] != yb.Data[i] {
			t.Fatal("equally seeded dropouts differ")
		}
	}
}

func TestGradEmbedding(t *testing.T) {
	rng := newRNG(7)
	e := NewEmbedding(5, 4, 1, rng)
	ids := tensor.FromSlice([]float32{0, 3, 3, 1, 4, 0}, 2, 3)
	gradCheck(t, e, Ctx{}, ids, gcOpts{noInput: true})
	_, st := e.Forward(Ctx{}, ids)
	if dx := e.Backward(st, tensor.New(2, 3, 4)); dx != nil {
		t.Error("embedding returned an input gradient")
	}
}

func TestGradPositionalEmbedding(t *testing.T) {
	rng := newRNG(8)
	p := NewPositionalEmbedding(6, 4, 1, rng)
	gradCheck(t, p, Ctx{}, randTensor(rng, 1, 2, 5, 4), gcOpts{})
}

func TestGradAttention(t *testing.T) {
	rng := newRNG(9)
	a := NewMultiHeadAttention(8, 2, 0.5, rng)
	for _, p := range a.Params() {
		fillNormal(p.Value.Data, rng, 0.5)
	}
	c := Ctx{Mask: testMask()}
	x := randTensor(rng, 1, 2, 5, 8)
	gradCheck(t, a, c, x, gcOpts{maxPerTensor: 16})

	// Padded keys must not influence real positions: changing the padded
	// tokens of sequence 0 leaves its outputs at real positions unchanged.
	y1, _ := a.Forward(c, x)
	x2 := x.Clone()
	for s := 3; s < 5; s++ {
		for j := 0; j < 8; j++ {
			x2.Data[s*8+j] += 5
		}
	}
	y2, _ := a.Forward(c, x2)
	for i := 0; i < 3*8; i++ {
		if math.Abs(float64(y1.Data[i]-y2.Data[i])) > 1e-6 {
			t.Fatalf("output %d changed when a padded key changed: %v vs %v", i, y1.Data[i], y2.Data[i])
		}
	}
}

func TestGradEncoderLayer(t *testing.T) {
	rng := newRNG(10)
	e := NewEncoderLayer(8, 2, 12, 0.2, rng)
	for _, p := range e.Params() {
		fillNormal(p.Value.Data, rng, 0.3)
	}
	e.LN1.Eps, e.LN2.Eps = 1e-5, 1e-5
	c := Ctx{Train: true, Mask: testMask()}
	gradCheck(t, e, c, randTensor(rng, 1, 2, 5, 8), gcOpts{reset: resetDropout(e.Drop1, e.Drop2), maxPerTensor: 12})
}

func TestGradExpert(t *testing.T) {
	rng := newRNG(11)
	e := NewExpert(6, rng)
	fillNormal(e.LN.Gamma.Value.Data, rng, 1)
	fillNormal(e.FFN.FC1.B.Value.Data, rng, 0.5)
	x := randTensor(rng, 1, 3, 6)
	// Keep ReLU inputs away from the kink at these weights.
	h, _ := e.LN.Forward(Ctx{}, x)
	pre, _ := e.FFN.FC1.Forward(Ctx{}, h)
	for i, v := range pre.Data {
		if math.Abs(float64(v)) < 0.05 {
			e.FFN.FC1.B.Value.Data[i%e.FFN.Inner] += 0.3
		}
	}
	gradCheck(t, e, Ctx{}, x, gcOpts{maxPerTensor: 16})
}

func TestGradSequential(t *testing.T) {
	rng := newRNG(12)
	s := NewSequential().
		Append("fc", NewLinear(5, 7, 0.5, rng)).
		Append("gelu", GELU{}).
		Append("drop", NewDropout(0.3, rng)).
		Append("ln", NewLayerNorm(7, 1e-5)).
		Append("out", NewLinear(7, 3, 0.5, rng))
	drop := s.Layers()[2].Module.(*Dropout)
	gradCheck(t, s, Ctx{Train: true}, randTensor(rng, 1, 4, 5), gcOpts{reset: resetDropout(drop)})
}

func TestGradMeanPool(t *testing.T) {
	rng := newRNG(13)
	gradCheck(t, MeanPool{}, Ctx{Mask: testMask()}, randTensor(rng, 1, 2, 5, 3), gcOpts{})
	gradCheck(t, MeanPool{}, Ctx{}, randTensor(rng, 1, 2, 5, 3), gcOpts{})
}

func TestGradPatchifyReshape(t *testing.T) {
	rng := newRNG(14)
	gradCheck(t, Patchify{Size: 6, Patch: 3}, Ctx{}, randTensor(rng, 1, 2, 36), gcOpts{})
	gradCheck(t, Flatten(12), Ctx{}, randTensor(rng, 1, 2, 3, 4), gcOpts{})
	// Tile 1 (top-right) of a 4×4 image with 2×2 patches holds pixels 2,3,6,7.
	img := tensor.New(1, 16)
	for i := range img.Data {
		img.Data[i] = float32(i)
	}
	y, _ := Patchify{Size: 4, Patch: 2}.Forward(Ctx{}, img)
	want := []float32{2, 3, 6, 7}
	for i, w := range want {
		if y.Data[4+i] != w {
			t.Fatalf("tile 1 = %v, want %v", y.Data[4:8], want)
		}
	}
}

func TestGradImageBERT(t *testing.T) {
	cfg := ImageBERTConfig{Size: 4, Patch: 2, Classes: 3,
		BERTConfig: BERTConfig{Hidden: 8, Heads: 2, Layers: 1, FFN: 8}}
	m, err := ImageBERT(cfg, newRNG(15))
	if err != nil {
		t.Fatal(err)
	}
	gradCheck(t, m, Ctx{}, randTensor(newRNG(16), 1, 2, 16), gcOpts{maxPerTensor: 6})
}

func TestGradSoftmaxCrossEntropy(t *testing.T) {
	rng := newRNG(17)
	logits := randTensor(rng, 2, 4, 5)
	labels := []int{0, 4, 2, 2}
	loss, d := SoftmaxCrossEntropy(logits, labels)
	checkCrossEntropy(t, logits, labels, loss, d, func() float32 {
		l, _ := SoftmaxCrossEntropy(logits, labels)
		return l
	})
	if acc := Accuracy(tensor.FromSlice([]float32{0, 1, 5, 2, 0, 0}, 3, 2), []int{1, 0, 1}); math.Abs(acc-2.0/3) > 1e-9 {
		t.Errorf("accuracy %v, want 2/3", acc)
	}
}

// checkCrossEntropy checks a cross-entropy loss and its gradient d over
// logits whose last dimension holds the classes and whose other dimensions
// are the positions: the loss against the mean over positions of
// −log softmax at the target, computed in float64, and d against central
// differences of lossAt (the loss at the current logits).
func checkCrossEntropy(t *testing.T, logits *tensor.Tensor, targets []int, loss float32, d *tensor.Tensor, lossAt func() float32) {
	t.Helper()
	classes := logits.Shape[len(logits.Shape)-1]
	var ref float64
	for i, tg := range targets {
		var s float64
		for j := 0; j < classes; j++ {
			s += math.Exp(float64(logits.Data[i*classes+j]))
		}
		ref += math.Log(s) - float64(logits.Data[i*classes+tg])
	}
	ref /= float64(len(targets))
	if math.Abs(float64(loss)-ref) > 1e-5 {
		t.Fatalf("loss %v, want the mean over positions %v", loss, ref)
	}
	for i := range logits.Data {
		old := logits.Data[i]
		logits.Data[i] = old + 1e-2
		lp := lossAt()
		logits.Data[i] = old - 1e-2
		lm := lossAt()
		logits.Data[i] = old
		num := float64(lp-lm) / 2e-2
		if math.Abs(num-float64(d.Data[i])) > 2e-3+2e-2*math.Abs(num) {
			t.Errorf("dlogits[%d] = %v, numeric %v", i, d.Data[i], num)
		}
	}
}

// The BERT masked language model end to end, tied and untied, with
// dropout replayed: every parameter's gradient, the tied table's being the
// sum of the embedding's and the head's.
func TestGradBERTMLM(t *testing.T) {
	for _, untied := range []bool{false, true} {
		cfg := BERTMLMConfig{Vocab: 9, Seq: 6, Hidden: 8, Heads: 2, Layers: 2, FFN: 12, Dropout: 0.2, Untied: untied}
		m, err := BERTMLM(cfg, newRNG(27))
		if err != nil {
			t.Fatal(err)
		}
		rng := newRNG(28)
		var drops []*Dropout
		for _, l := range m.Layers() {
			switch mod := l.Module.(type) {
			case *Dropout:
				drops = append(drops, mod)
			case *EncoderLayer:
				drops = append(drops, mod.Drop1, mod.Drop2)
				// BERT's eps of 1e-12 leaves float32 finite differences
				// too little room; the formula is the same.
				mod.LN1.Eps, mod.LN2.Eps = 1e-5, 1e-5
			case *LayerNorm:
				mod.Eps = 1e-5
			}
		}
		for _, p := range m.Params() {
			fillNormal(p.Value.Data, rng, 0.3)
		}
		ids := tensor.FromSlice([]float32{1, 4, 7, 0, 8, 2, 3, 8, 5, 6}, 2, 5)
		gradCheck(t, m, Ctx{Train: true}, ids, gcOpts{noInput: true, reset: resetDropout(drops...), maxPerTensor: 8})
	}
}

// The ignore-label loss is the mean over the counted positions only: equal
// to the plain sequence loss of those positions, with a zero gradient at
// the ignored ones whatever their logits, and a gradient that matches
// finite differences.
func TestGradMaskedSequenceCrossEntropy(t *testing.T) {
	rng := newRNG(29)
	logits := randTensor(rng, 2, 2, 4, 5)
	targets := []int{IgnoreLabel, 4, IgnoreLabel, 2, 0, IgnoreLabel, IgnoreLabel, 3}
	loss, d, n := MaskedSequenceCrossEntropy(logits, targets)
	if n != 4 || !slices.Equal(d.Shape, logits.Shape) {
		t.Fatalf("n %d, gradient shape %v", n, d.Shape)
	}
	// The same as SequenceCrossEntropy over the counted rows alone.
	rows := []int{1, 3, 4, 7}
	picked := tensor.New(1, len(rows), 5)
	var labels []int
	for k, i := range rows {
		copy(picked.Data[k*5:(k+1)*5], logits.Data[i*5:(i+1)*5])
		labels = append(labels, targets[i])
	}
	ref, _ := SequenceCrossEntropy(picked, labels)
	if math.Abs(float64(loss-ref)) > 1e-6 {
		t.Fatalf("loss %v, the counted positions' mean %v", loss, ref)
	}
	// Ignored positions contribute nothing: changing their logits leaves
	// the loss, and their gradient is zero.
	for i, tg := range targets {
		if tg != IgnoreLabel {
			continue
		}
		for j := 0; j < 5; j++ {
			if d.Data[i*5+j] != 0 {
				t.Fatalf("gradient at ignored position %d is %v", i, d.Data[i*5:(i+1)*5])
			}
			logits.Data[i*5+j] += 7
		}
	}
	if again, _, _ := MaskedSequenceCrossEntropy(logits, targets); again != loss {
		t.Fatalf("changing ignored logits changed the loss: %v → %v", loss, again)
	}
	// Finite differences over every logit, ignored ones included.
	for i := range logits.Data {
		old := logits.Data[i]
		logits.Data[i] = old + 1e-2
		lp, _, _ := MaskedSequenceCrossEntropy(logits, targets)
		logits.Data[i] = old - 1e-2
		lm, _, _ := MaskedSequenceCrossEntropy(logits, targets)
		logits.Data[i] = old
		num := float64(lp-lm) / 2e-2
		if math.Abs(num-float64(d.Data[i])) > 2e-3+2e-2*math.Abs(num) {
			t.Errorf("dlogits[%d] = %v, numeric %v", i, d.Data[i], num)
		}
	}
	// Nothing to predict: no loss, no gradient.
	none := []int{IgnoreLabel, IgnoreLabel, IgnoreLabel, IgnoreLabel, IgnoreLabel, IgnoreLabel, IgnoreLabel, IgnoreLabel}
	if l, g, k := MaskedSequenceCrossEntropy(logits, none); l != 0 || k != 0 || slices.ContainsFunc(g.Data, func(v float32) bool { return v != 0 }) {
		t.Errorf("all ignored: loss %v, n %d", l, k)
	}
}
