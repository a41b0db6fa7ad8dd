package nn

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// Every parameter of the models belongs to a described layer, and a tied
// head names the table it borrows.
func TestDescribe(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	bert, err := ImageBERT(ImageBERTTiny(), rng)
	if err != nil {
		t.Fatal(err)
	}
	gpt, err := GPT(GPTConfig{Vocab: 50, Seq: 8, Hidden: 16, Heads: 2, Layers: 2, FFN: 32}, rng)
	if err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]*Sequential{"mlp": MLP([]int{784, 32, 10}, 0.1, rng), "bert": bert, "gpt": gpt} {
		ls, err := Describe(m)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(ls) != m.Len() {
			t.Fatalf("%s: %d descriptions of %d layers", name, len(ls), m.Len())
		}
		for _, p := range m.Params() {
			found := false
			for _, l := range ls {
				found = found || strings.HasPrefix(p.Name, l.Name+".")
			}
			if !found {
				t.Fatalf("%s: parameter %s belongs to no described layer", name, p.Name)
			}
		}
		if name == "gpt" {
			last := ls[len(ls)-1]
			if last.Type != "tied_head" || last.Table != "0.embed.weight" || ls[3].Type != "decoder" || !ls[3].Causal {
				t.Fatalf("gpt described as %+v", ls)
			}
		}
	}
	if _, err := Describe(NewSequential().Append("x", &Sequential{})); err == nil {
		t.Fatal("an unknown module type was described")
	}
}
