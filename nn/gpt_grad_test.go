package nn

import (
	"math"
	"slices"
	"testing"

	"github.com/skyhive/skyhive/tensor"
)

func TestGradCausalAttention(t *testing.T) {
	rng := newRNG(20)
	a := NewCausalSelfAttention(8, 2, 0.5, rng)
	for _, p := range a.Params() {
		fillNormal(p.Value.Data, rng, 0.5)
	}
	x := randTensor(rng, 1, 2, 5, 8)
	gradCheck(t, a, Ctx{}, x, gcOpts{maxPerTensor: 16})
	// Causal and padding masks together.
	gradCheck(t, a, Ctx{Mask: testMask()}, x, gcOpts{maxPerTensor: 16})
}

// attentionWeights returns the attention weights of the forward pass.
func attentionWeights(a *MultiHeadAttention, c Ctx, x *tensor.Tensor) []float32 {
	_, st := a.Forward(c, x)
	return st.(*attentionState).p
}

func TestCausalAttentionMasksFuture(t *testing.T) {
	rng := newRNG(21)
	const b, s, h = 2, 5, 8
	a := NewCausalSelfAttention(h, 2, 0.5, rng)
	x := randTensor(rng, 1, b, s, h)
	// Weights: zero above the diagonal, rows summing to one.
	p := attentionWeights(a, Ctx{}, x)
	for m := 0; m < b*a.Heads; m++ {
		for i := 0; i < s; i++ {
			row := p[(m*s+i)*s : (m*s+i+1)*s]
			var sum float64
			for j, v := range row {
				if j > i && v != 0 {
					t.Fatalf("head %d: query %d attends to later key %d (weight %v)", m, i, j, v)
				}
				sum += float64(v)
			}
			if math.Abs(sum-1) > 1e-5 {
				t.Fatalf("head %d row %d sums to %v", m, i, sum)
			}
		}
	}
	// With padding, a query attends only to earlier real keys.
	p = attentionWeights(a, Ctx{Mask: testMask()}, x)
	for i := 0; i < s; i++ {
		for j := 0; j < s; j++ {
			if v := p[i*s+j]; (j > i || j >= 3) && v != 0 {
				t.Fatalf("sequence 0 query %d attends to key %d (weight %v)", i, j, v)
			}
		}
	}
	// Changing position t+1.. leaves every output at positions ≤ t unchanged.
	y1, _ := a.Forward(Ctx{}, x)
	for pos := 1; pos < s; pos++ {
		x2 := x.Clone()
		for bi := 0; bi < b; bi++ {
			for j := 0; j < h; j++ {
				x2.Data[(bi*s+pos)*h+j] += 3
			}
		}
		y2, _ := a.Forward(Ctx{}, x2)
		for bi := 0; bi < b; bi++ {
			lo := bi * s * h
			if !slices.Equal(y1.Data[lo:lo+pos*h], y2.Data[lo:lo+pos*h]) {
				t.Fatalf("changing position %d changed an earlier output of sequence %d", pos, bi)
			}
			if slices.Equal(y1.Data[lo+pos*h:lo+(pos+1)*h], y2.Data[lo+pos*h:lo+(pos+1)*h]) {
				t.Fatalf("changing position %d did not change its own output", pos)
			}
		}
	}
	// The non-causal layer with the same weights does look ahead.
	a.Causal = false
	y3, _ := a.Forward(Ctx{}, x)
	if slices.Equal(y1.Data[:h], y3.Data[:h]) {
		t.Error("causal and bidirectional attention agree at position 0")
	}
}

func TestGradDecoderLayer(t *testing.T) {
	rng := newRNG(22)
	d := NewDecoderLayer(8, 2, 12, 0.2, rng)
	for _, p := range d.Params() {
		fillNormal(p.Value.Data, rng, 0.3)
	}
	c := Ctx{Train: true}
	gradCheck(t, d, c, randTensor(rng, 1, 2, 5, 8), gcOpts{reset: resetDropout(d.Drop1, d.Drop2), maxPerTensor: 12})
	if got, want := d.Cost([]int{2, 5, 8}).Params, NumParams(d.Params()); got != want {
		t.Errorf("decoder cost counts %d parameters, has %d", got, want)
	}
}

// ownedHead makes a TiedHead list its table, so that gradCheck checks the
// head's gradient for the table on its own.
type ownedHead struct{ *TiedHead }

func (o ownedHead) Params() []*Param { return o.Borrowed() }

func TestGradTiedHead(t *testing.T) {
	rng := newRNG(23)
	e := NewEmbedding(7, 6, 1, rng)
	h := NewTiedHead(e)
	if h.Table != e.Table {
		t.Fatal("head does not share the embedding's table")
	}
	if len(h.Params()) != 0 || len(h.Borrowed()) != 1 || h.Cost([]int{2, 3, 6}).Params != 0 {
		t.Error("the head must borrow, not own, the table")
	}
	gradCheck(t, ownedHead{h}, Ctx{}, randTensor(rng, 1, 2, 3, 6), gcOpts{})

	// Embedding → head: the table's gradient is the sum of both uses, and
	// the model lists the table once.
	m := NewSequential().Append("embed", e).Append("ln", NewLayerNorm(6, 1e-5)).Append("head", h)
	if ps := m.Params(); len(ps) != 3 || ps[0].Name != "0.embed.weight" {
		t.Fatalf("params %v, want the table once and the LayerNorm", paramNames(m))
	}
	ids := tensor.FromSlice([]float32{0, 3, 3, 1, 6, 0}, 2, 3)
	gradCheck(t, m, Ctx{}, ids, gcOpts{noInput: true, maxPerTensor: 42})

	// The sum, term by term.
	ZeroGrad(m.Params())
	dy := randTensor(rng, 1, 2, 3, 7)
	_, st := m.Forward(Ctx{}, ids)
	m.Backward(st, dy)
	total := slices.Clone(e.Table.Grad.Data)
	ZeroGrad(m.Params())
	sts := st.([]State)
	dh := h.Backward(sts[2], dy)
	headOnly := slices.Clone(e.Table.Grad.Data)
	ZeroGrad(m.Params())
	e.Backward(sts[0], m.Layers()[1].Module.Backward(sts[1], dh))
	for i := range total {
		if d := total[i] - headOnly[i] - e.Table.Grad.Data[i]; math.Abs(float64(d)) > 1e-5 {
			t.Fatalf("table gradient %d: %v is not head %v + embedding %v", i, total[i], headOnly[i], e.Table.Grad.Data[i])
		}
	}
}

func TestGradGPT(t *testing.T) {
	cfg := GPTConfig{Vocab: 9, Seq: 6, Hidden: 8, Heads: 2, Layers: 2, FFN: 12, Dropout: 0.2}
	m, err := GPT(cfg, newRNG(24))
	if err != nil {
		t.Fatal(err)
	}
	rng := newRNG(25)
	var drops []*Dropout
	for _, l := range m.Layers() {
		switch mod := l.Module.(type) {
		case *Dropout:
			drops = append(drops, mod)
		case *DecoderLayer:
			drops = append(drops, mod.Drop1, mod.Drop2)
		}
	}
	for _, p := range m.Params() {
		fillNormal(p.Value.Data, rng, 0.3)
	}
	ids := tensor.FromSlice([]float32{1, 4, 7, 0, 8, 2, 3, 3, 5, 6}, 2, 5)
	gradCheck(t, m, Ctx{Train: true}, ids, gcOpts{noInput: true, reset: resetDropout(drops...), maxPerTensor: 8})
}

func TestGradSequenceCrossEntropy(t *testing.T) {
	rng := newRNG(26)
	logits := randTensor(rng, 2, 2, 3, 5)
	targets := []int{0, 4, 2, 2, 1, 3}
	loss, d := SequenceCrossEntropy(logits, targets)
	if !slices.Equal(d.Shape, logits.Shape) {
		t.Fatalf("gradient shape %v, want %v", d.Shape, logits.Shape)
	}
	checkCrossEntropy(t, logits, targets, loss, d, func() float32 {
		l, _ := SequenceCrossEntropy(logits, targets)
		return l
	})
}

func TestNextTokenTargets(t *testing.T) {
	w := tensor.FromSlice([]float32{1, 2, 3, 4, 5, 6, 7, 8}, 2, 4)
	x, y, err := NextTokenTargets(w, 9)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(x.Shape, []int{2, 3}) || !slices.Equal(x.Data, []float32{1, 2, 3, 5, 6, 7}) || !slices.Equal(y, []int{2, 3, 4, 6, 7, 8}) {
		t.Errorf("inputs %v %v, targets %v", x.Shape, x.Data, y)
	}
	for _, bad := range []*tensor.Tensor{
		tensor.FromSlice([]float32{1, 2, 3, 9}, 2, 2),                     // id = vocab
		tensor.FromSlice([]float32{1, -1}, 1, 2),                          // negative
		tensor.FromSlice([]float32{1, 2.5}, 1, 2),                         // not an integer
		tensor.FromSlice([]float32{1, float32(math.NaN())}, 1, 2),         // NaN
		tensor.FromSlice([]float32{1, 2}, 2, 1),                           // seq 0
		tensor.FromSlice([]float32{1, 2}, 2),                              // 1-D
		{Shape: []int{2, 3}, Data: []float32{1, 2}},                       // shape and data disagree
		tensor.FromSlice([]float32{1, float32(math.Inf(1)), 3, 4}, 2, 2),  // +Inf
		tensor.FromSlice([]float32{float32(math.Inf(-1)), 1, 3, 4}, 2, 2), // −Inf
		tensor.FromSlice([]float32{1e10, 1, 3, 4}, 2, 2),                  // huge
	} {
		_, _, err := NextTokenTargets(bad, 9)
		if err == nil {
			t.Errorf("%v %v accepted", bad.Shape, bad.Data)
		}
	}
}

func FuzzNextTokenTargets(f *testing.F) {
	f.Add(2, 3, []byte{1, 2, 3, 4, 5, 6})
	f.Add(1, 2, []byte{0, 255})
	f.Fuzz(func(t *testing.T, b, w int, raw []byte) {
		if b < 0 || w < 0 || b > 64 || w > 64 {
			return
		}
		data := make([]float32, min(len(raw), b*w))
		for i := range data {
			data[i] = float32(int8(raw[i])) / 4
		}
		x, y, err := NextTokenTargets(&tensor.Tensor{Shape: []int{b, w}, Data: data}, 20)
		if err != nil {
			return
		}
		if len(data) != b*w || w < 2 || b < 1 {
			t.Fatalf("accepted shape [%d %d] with %d values", b, w, len(data))
		}
		for i, v := range y {
			if v < 0 || v >= 20 || float32(v) != data[(i/(w-1))*w+i%(w-1)+1] {
				t.Fatalf("target %d = %d", i, v)
			}
		}
		e := NewEmbedding(20, 2, 1, newRNG(1))
		e.Forward(Ctx{}, x) // must not panic
	})
}
