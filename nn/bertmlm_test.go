package nn

import (
	"math"
	"slices"
	"testing"

	"github.com/skyhive/skyhive/tensor"
)

func tinyBERTMLMConfig() BERTMLMConfig {
	return BERTMLMConfig{Vocab: 13, Seq: 8, Hidden: 16, Heads: 2, Layers: 2, FFN: 32}
}

// outputAt returns the logits of position pos of sequence 0.
func outputAt(y *tensor.Tensor, pos int) []float32 {
	v := y.Shape[2]
	return y.Data[pos*v : (pos+1)*v]
}

// The masked language model is bidirectional: changing a later token
// changes the outputs at earlier positions (a causal GPT's stay the same),
// and changing an earlier token changes later ones.
func TestBERTMLMIsBidirectional(t *testing.T) {
	cfg := tinyBERTMLMConfig()
	m, err := BERTMLM(cfg, newRNG(40))
	if err != nil {
		t.Fatal(err)
	}
	gpt, err := GPT(GPTConfig{Vocab: cfg.Vocab, Seq: cfg.Seq, Hidden: cfg.Hidden, Heads: cfg.Heads, Layers: cfg.Layers, FFN: cfg.FFN}, newRNG(40))
	if err != nil {
		t.Fatal(err)
	}
	// Weights of std 0.3 rather than BERT's 0.02, so that one token's
	// effect on another position is far above float32 rounding.
	rng := newRNG(42)
	for _, p := range append(m.Params(), gpt.Params()...) {
		fillNormal(p.Value.Data, rng, 0.3)
	}
	x := tensor.FromSlice([]float32{3, 1, 4, 1, 5, 9, 2, 6}, 1, 8)
	later := x.Clone()
	later.Data[6] = 11 // position 6 of 8
	earlier := x.Clone()
	earlier.Data[1] = 7
	diff := func(model *Sequential, a, b *tensor.Tensor, pos int) float64 {
		ya, _ := model.Forward(Ctx{}, a)
		yb, _ := model.Forward(Ctx{}, b)
		d := 0.0
		for i, v := range outputAt(ya, pos) {
			d = math.Max(d, math.Abs(float64(v-outputAt(yb, pos)[i])))
		}
		return d
	}
	for pos := 0; pos < 6; pos++ {
		if d := diff(m, x, later, pos); d < 1e-4 {
			t.Errorf("changing token 6 changed position %d's logits by at most %g: not bidirectional", pos, d)
		}
		if d := diff(gpt, x, later, pos); d > 1e-6 {
			t.Fatalf("the causal GPT's position %d depends on token 6 (%g): the test cannot tell", pos, d)
		}
	}
	if d := diff(m, x, earlier, 5); d < 1e-4 {
		t.Errorf("changing token 1 changed position 5's logits by at most %g", d)
	}
}

// The built model has the parameters NumParams counts, the layout the
// documentation gives, a description, and an untied head that starts equal
// to the tied table.
func TestBERTMLMBuild(t *testing.T) {
	for _, untied := range []bool{false, true} {
		cfg := tinyBERTMLMConfig()
		cfg.Untied = untied
		m, err := BERTMLM(cfg, newRNG(41))
		if err != nil {
			t.Fatal(err)
		}
		if got := float64(NumParams(m.Params())); got != cfg.NumParams() {
			t.Errorf("untied %v: %v parameters, NumParams says %v", untied, got, cfg.NumParams())
		}
		c := m.Cost([]int{3, 8})
		y, _ := m.Forward(Ctx{}, tensor.New(3, 8))
		if !slices.Equal(c.OutShape, []int{3, 8, 13}) || !slices.Equal(y.Shape, c.OutShape) {
			t.Errorf("output %v, cost %v, want [3 8 13]", y.Shape, c.OutShape)
		}
		ls, err := Describe(m)
		if err != nil {
			t.Fatal(err)
		}
		var types []string
		for _, l := range ls {
			types = append(types, l.Type)
		}
		head := "tied_head"
		if untied {
			head = "head"
		}
		want := []string{"embedding", "positional_embedding", "layernorm", "dropout", "encoder", "encoder", "linear", "gelu", "layernorm", head}
		if !slices.Equal(types, want) || ls[4].Causal || ls[4].Eps != float64(float32(1e-12)) {
			t.Errorf("described as %v (%+v), want %v, bidirectional, eps 1e-12", types, ls[4], want)
		}
		if !untied && ls[len(ls)-1].Table != "0.embed.weight" {
			t.Errorf("tied head borrows %q", ls[len(ls)-1].Table)
		}
		if untied {
			// Every parameter of the tied model, with the same values,
			// and a head weight of its own draw.
			tied, _ := BERTMLM(tinyBERTMLMConfig(), newRNG(41))
			tp, up := ExportParams(tied.Params()), ExportParams(m.Params())
			for name, v := range tp {
				if u, ok := up[name]; !ok || !slices.Equal(u.Data, v.Data) {
					t.Errorf("parameter %s differs between the tied and untied models", name)
				}
			}
			head, ok := up["9.head.weight"]
			if !ok || len(up) != len(tp)+1 || slices.Equal(head.Data, tp["0.embed.weight"].Data) {
				t.Errorf("untied head: %v among %d parameters (tied %d)", ok, len(up), len(tp))
			}
		}
	}
	if id := tinyBERTMLMConfig().MaskID(); id != 12 {
		t.Errorf("MaskID %d, want the last id 12", id)
	}
	for _, bad := range []BERTMLMConfig{
		{Vocab: 1, Seq: 8, Hidden: 16, Heads: 2, Layers: 1, FFN: 8},
		{Vocab: 10, Seq: 0, Hidden: 16, Heads: 2, Layers: 1, FFN: 8},
		{Vocab: 10, Seq: 8, Hidden: 15, Heads: 2, Layers: 1, FFN: 8},
		{Vocab: 10, Seq: 8, Hidden: 16, Heads: 2, Layers: 1, FFN: 8, Dropout: 1},
	} {
		if _, err := BERTMLM(bad, newRNG(1)); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	// BERT-base and BERT-large as published: 110M and 335M parameters with
	// BERT's WordPiece vocabulary and 512 positions (BERT's also have a
	// segment table of 2·Hidden and an output bias, which these omit).
	for _, c := range []struct {
		cfg  BERTMLMConfig
		want float64
	}{{BERTMLMBase(30522, 512), 109.5e6}, {BERTMLMLarge(30522, 512), 335.1e6}} {
		if n := c.cfg.NumParams(); math.Abs(n-c.want) > 1e6 {
			t.Errorf("%+v: %.1fM parameters, want about %.1fM", c.cfg, n/1e6, c.want/1e6)
		}
	}
}
