package nn

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestGradHead checks the untied head's gradients numerically.
func TestGradHead(t *testing.T) {
	rng := newRNG(29)
	h := NewHead(7, 6, 1, rng)
	if ps := h.Params(); len(ps) != 1 || ps[0] != h.Weight {
		t.Fatal("the untied head must own its weight")
	}
	if got := h.Cost([]int{2, 3, 6}).Params; got != 42 {
		t.Errorf("cost counts %d parameters, want 42", got)
	}
	gradCheck(t, h, Ctx{}, randTensor(rng, 1, 2, 3, 6), gcOpts{})
}

// TestGPTUntied builds the same configuration tied and untied from the
// same generator: the untied model has every parameter of the tied one
// with the same values, plus a head weight that starts equal to the table
// but is a separate parameter, and no borrowed parameters anywhere, so
// each of its slices is self-contained.
func TestGPTUntied(t *testing.T) {
	cfg := GPTConfig{Vocab: 11, Seq: 5, Hidden: 8, Heads: 2, Layers: 2, FFN: 16}
	build := func(c GPTConfig) *Sequential {
		m, err := GPT(c, rand.New(rand.NewPCG(5, 6)))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	tied := build(cfg)
	ucfg := cfg
	ucfg.Untied = true
	untied := build(ucfg)

	tp, up := ExportParams(tied.Params()), ExportParams(untied.Params())
	if len(up) != len(tp)+1 {
		t.Fatalf("untied model has %d parameters, tied %d", len(up), len(tp))
	}
	for name, v := range tp {
		if u, ok := up[name]; !ok || !slices.Equal(u.Data, v.Data) {
			t.Fatalf("parameter %s differs between the tied and untied models", name)
		}
	}
	headName := "6.head.weight"
	head, ok := up[headName]
	if !ok {
		t.Fatalf("no %s among %v", headName, paramNames(untied))
	}
	if slices.Equal(head.Data, up["0.embed.weight"].Data) {
		t.Fatal("the head weight is a copy of the table; want its own draw")
	}
	if got, want := float64(NumParams(untied.Params())), ucfg.NumParams(); got != want {
		t.Errorf("untied NumParams %v, built %v", want, got)
	}
	if got, want := float64(NumParams(tied.Params())), cfg.NumParams(); got != want {
		t.Errorf("tied NumParams %v, built %v", want, got)
	}
	if b := untied.Borrowed(); len(b) != 0 {
		t.Errorf("untied model borrows %d parameters", len(b))
	}
	if b := untied.Slice(untied.Len()-2, untied.Len()).Borrowed(); len(b) != 0 {
		t.Errorf("the untied model's last layers borrow %d parameters", len(b))
	}
	if b := tied.Slice(tied.Len()-2, tied.Len()).Borrowed(); len(b) != 1 {
		t.Errorf("the tied model's last layers borrow %d parameters, want the table", len(b))
	}
}
