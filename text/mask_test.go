package text

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/tensor"
)

// randomIDs returns [batch, seq] ids drawn uniformly from [0, vocab).
func randomIDs(batch, seq, vocab int, seed uint64) *tensor.Tensor {
	rng := rand.New(rand.NewPCG(seed, 3))
	x := tensor.New(batch, seq)
	for i := range x.Data {
		x.Data[i] = float32(rng.IntN(vocab))
	}
	return x
}

// Over many sequences, BERT's recipe holds: exactly round(15%) of each
// row's positions are chosen, every position as often as any other, and of
// the chosen 80% become [MASK], 10% a random token and 10% stay; the
// labels are the originals there and IgnoreLabel elsewhere, where the input
// is unchanged.
func TestMaskProportions(t *testing.T) {
	const batch, seq, vocab = 4000, 64, 5000
	m := BERTMasking(vocab, vocab)
	ids := randomIDs(batch, seq, vocab, 1)
	orig := ids.Clone()
	x, labels, err := m.Apply(ids, rand.New(rand.NewPCG(7, 7)))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids.Data, orig.Data) {
		t.Fatal("Apply modified its input")
	}
	if !slices.Equal(x.Shape, []int{batch, seq}) || len(labels) != batch*seq {
		t.Fatalf("input %v, %d labels", x.Shape, len(labels))
	}
	want := m.Chosen(seq) // round(9.6) = 10
	if want != 10 {
		t.Fatalf("Chosen(64) = %d, want 10", want)
	}
	var masked, random, kept, chosen int
	perPos := make([]int, seq)
	for b := range batch {
		inRow := 0
		for p := range seq {
			i := b*seq + p
			if labels[i] == IgnoreLabel {
				if x.Data[i] != orig.Data[i] {
					t.Fatalf("row %d position %d: unchosen token changed", b, p)
				}
				continue
			}
			if float32(labels[i]) != orig.Data[i] {
				t.Fatalf("row %d position %d: label %d, original %v", b, p, labels[i], orig.Data[i])
			}
			inRow++
			perPos[p]++
			switch v := x.Data[i]; {
			case v == float32(m.MaskID):
				masked++
			case v == orig.Data[i]:
				kept++ // or a random draw of the same token, 1 in 5000
			default:
				if v < 0 || v >= vocab {
					t.Fatalf("random replacement %v outside the vocabulary", v)
				}
				random++
			}
		}
		if inRow != want {
			t.Fatalf("row %d: %d positions chosen, want %d", b, inRow, want)
		}
		chosen += inRow
	}
	// 40 000 chosen positions: the standard deviations of the fractions
	// are 0.002 (80%) and 0.0015 (10%); the tolerances are 5 of them.
	for _, c := range []struct {
		name      string
		n         int
		want, tol float64
	}{{"[MASK]", masked, 0.8, 0.01}, {"random", random, 0.1, 0.0075}, {"unchanged", kept, 0.1, 0.0075}} {
		if f := float64(c.n) / float64(chosen); math.Abs(f-c.want) > c.tol {
			t.Errorf("%s: %.4f of the chosen positions, want %.2f ± %.4f", c.name, f, c.want, c.tol)
		}
	}
	// Each position is chosen in 10/64 of the rows: 625 ± 23 of 4000.
	for p, n := range perPos {
		if math.Abs(float64(n)-625) > 115 {
			t.Errorf("position %d chosen %d times, want about 625", p, n)
		}
	}
}

// The same generator seed gives the same masking; another seed another.
func TestMaskDeterminism(t *testing.T) {
	m := BERTMasking(300, 300)
	ids := randomIDs(8, 32, 300, 2)
	run := func(seed uint64) (*tensor.Tensor, []int) {
		x, l, err := m.Apply(ids, rand.New(rand.NewPCG(seed, 1)))
		if err != nil {
			t.Fatal(err)
		}
		return x, l
	}
	xa, la := run(5)
	xb, lb := run(5)
	xc, lc := run(6)
	if !slices.Equal(xa.Data, xb.Data) || !slices.Equal(la, lb) {
		t.Error("the same seed gave different maskings")
	}
	if slices.Equal(xa.Data, xc.Data) && slices.Equal(la, lc) {
		t.Error("seeds 5 and 6 gave the same masking")
	}
}

// Short sequences still get one position; a rate of 1 chooses every one.
func TestMaskAtLeastOne(t *testing.T) {
	m := BERTMasking(10, 10)
	for seq, want := range map[int]int{1: 1, 3: 1, 6: 1, 7: 1, 10: 2, 64: 10, 128: 19, 512: 77} {
		if got := m.Chosen(seq); got != want {
			t.Errorf("Chosen(%d) = %d, want %d", seq, got, want)
		}
	}
	_, labels, err := m.Apply(randomIDs(50, 3, 10, 3), rand.New(rand.NewPCG(1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	for b := range 50 {
		n := 0
		for _, l := range labels[b*3 : b*3+3] {
			if l != IgnoreLabel {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("row %d of 3 tokens: %d chosen, want 1", b, n)
		}
	}
	all := m
	all.Rate, all.MaskProb, all.RandomProb = 1, 1, 0
	x, labels, err := all.Apply(randomIDs(2, 5, 10, 4), rand.New(rand.NewPCG(1, 1)))
	if err != nil || slices.Contains(labels, IgnoreLabel) || slices.ContainsFunc(x.Data, func(v float32) bool { return v != 10 }) {
		t.Errorf("rate 1, always [MASK]: %v, %v, %v", x.Data, labels, err)
	}
}

// Bad recipes and bad ids are errors that say what is wrong.
func TestMaskBadInput(t *testing.T) {
	ids := randomIDs(2, 4, 10, 5)
	rng := rand.New(rand.NewPCG(1, 1))
	for _, c := range []struct {
		m    Masking
		want string
	}{
		{BERTMasking(5, 10), "inside the data's vocabulary"},
		{BERTMasking(-1, 10), "[MASK] id -1"},
		{BERTMasking(10, 0), "vocabulary 0"},
		{Masking{MaskID: 10, Vocab: 10, Rate: 0, MaskProb: 0.8}, "rate 0"},
		{Masking{MaskID: 10, Vocab: 10, Rate: 1.5, MaskProb: 0.8}, "rate 1.5"},
		{Masking{MaskID: 10, Vocab: 10, Rate: 0.15, MaskProb: 0.8, RandomProb: 0.3}, "sum of at most 1"},
		{Masking{MaskID: 10, Vocab: 10, Rate: 0.15, MaskProb: -0.1}, "non-negative"},
		{Masking{MaskID: 10, Vocab: 10, Rate: math.NaN()}, "rate NaN"},
	} {
		if _, _, err := c.m.Apply(ids, rng); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error containing %q", c.m, err, c.want)
		}
	}
	m := BERTMasking(10, 10)
	for _, bad := range []*tensor.Tensor{
		tensor.FromSlice([]float32{1, 2, 10, 3}, 2, 2),  // id = vocab
		tensor.FromSlice([]float32{1, -1, 2, 3}, 2, 2),  // negative
		tensor.FromSlice([]float32{1, 2.5, 2, 3}, 2, 2), // not an integer
		tensor.FromSlice([]float32{1, float32(math.NaN()), 2, 3}, 2, 2),
		tensor.FromSlice([]float32{1, 2, 3}, 3),     // 1-D
		{Shape: []int{2, 3}, Data: []float32{1, 2}}, // shape and data disagree
		tensor.New(0, 4),
	} {
		if _, _, err := m.Apply(bad, rng); err == nil {
			t.Errorf("%v %v accepted", bad.Shape, bad.Data)
		}
	}
	if _, _, err := m.Apply(ids, nil); err == nil {
		t.Error("no generator accepted")
	}
}
