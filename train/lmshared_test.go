package train

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/skyhive/skyhive/text"
)

// Tokenize is the one language-model data path: BPE on text (or a given
// tokenizer), range-checked token data, the same split for the same seed.
func TestTokenize(t *testing.T) {
	corpus := Corpus{Name: "text:x", Text: sentences(3000, 1)}
	var log bytes.Buffer
	d, err := Tokenize(corpus, TokenizeOptions{Vocab: 300, Seed: 7, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if d.Tokenizer == nil || d.Vocab != d.Tokenizer.VocabSize() || d.Vocab > 300 || d.Vocab <= 256 {
		t.Fatalf("vocabulary %d, tokenizer %v", d.Vocab, d.Tokenizer)
	}
	ids := d.Tokenizer.Encode(corpus.Text)
	if d.Tokens() != len(ids) {
		t.Fatalf("%d tokens split, %d encoded", d.Tokens(), len(ids))
	}
	// A tenth for validation by default: the split of text.Split(0.1).
	wantTrain, wantVal, err := text.Split(ids, 0.1, 7)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Train, wantTrain) || !slices.Equal(d.Val, wantVal) {
		t.Fatal("the split is not text.Split(ids, 0.1, seed)")
	}
	if !strings.Contains(log.String(), "training a BPE tokenizer of 300 tokens") {
		t.Errorf("log %q", log.String())
	}
	// A given tokenizer encodes without training (nothing logged), and
	// TokenizeLM is the same path.
	log.Reset()
	again, err := Tokenize(corpus, TokenizeOptions{Tokenizer: d.Tokenizer, Seed: 7, Log: &log})
	if err != nil || log.Len() != 0 || !slices.Equal(again.Val, d.Val) {
		t.Fatalf("with the tokenizer: %v, log %q", err, log.String())
	}
	same, err := TokenizeLM(corpus, 300, 0.1, 7)
	if err != nil || !slices.Equal(same.Train, d.Train) {
		t.Fatalf("TokenizeLM: %v", err)
	}

	toks := Corpus{Name: "tokens:x", Tokens: []int32{1, 2, 3, 4, 5, 6, 7, 0, 1, 2}, Vocab: 8}
	if d, err := Tokenize(toks, TokenizeOptions{Seed: 1}); err != nil || d.Vocab != 8 || d.Tokenizer != nil || d.Tokens() != 10 {
		t.Fatalf("token data: %+v, %v", d, err)
	}
	for _, tc := range []struct {
		name   string
		corpus Corpus
		o      TokenizeOptions
		want   string
	}{
		{"id beyond vocab", Corpus{Name: "tokens:x", Tokens: []int32{1, 8, 2}, Vocab: 8}, TokenizeOptions{}, "outside the vocabulary of 8"},
		{"negative id", Corpus{Name: "tokens:x", Tokens: []int32{1, -1, 2}, Vocab: 8}, TokenizeOptions{}, "outside the vocabulary"},
		{"no vocabulary", Corpus{Name: "tokens:x", Tokens: []int32{1, 2}}, TokenizeOptions{}, "vocabulary size"},
		{"vocab too small", corpus, TokenizeOptions{Vocab: 100}, "at least 256"},
		{"empty text", Corpus{Name: "text:x", Text: []byte{}}, TokenizeOptions{Vocab: 300}, "no text"},
		{"nothing", Corpus{Name: "x"}, TokenizeOptions{Vocab: 300}, "no text or tokens"},
	} {
		if _, err := Tokenize(tc.corpus, tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %q", tc.name, err, tc.want)
		}
	}
}

// One rule for the evaluation cut: evalTokens predicted tokens read
// evalTokens+1 ids; causal evaluation then keeps whole windows.
func TestEvalCut(t *testing.T) {
	val := make([]int32, 100)
	for i := range val {
		val[i] = int32(i)
	}
	for _, tc := range []struct{ evalTokens, want int }{{0, 100}, {10, 11}, {98, 99}, {99, 100}, {500, 100}} {
		if got := EvalCut(val, tc.evalTokens); len(got) != tc.want || got[0] != 0 {
			t.Errorf("EvalCut(100 ids, %d) keeps %d ids, want %d", tc.evalTokens, len(got), tc.want)
		}
	}
	d := LMData{Train: val, Val: val}
	for _, tc := range []struct{ evalTokens, seq, want int }{{0, 16, 97}, {40, 16, 33}, {32, 16, 33}, {31, 16, 17}, {16, 16, 17}} {
		got, err := d.EvalIDs(tc.evalTokens, tc.seq)
		if err != nil || len(got) != tc.want {
			t.Errorf("EvalIDs(%d, %d): %d ids, %v; want %d", tc.evalTokens, tc.seq, len(got), err, tc.want)
		}
	}
	if _, err := d.EvalIDs(15, 16); err == nil || !errors.Is(err, text.ErrEmpty) || !strings.Contains(err.Error(), "--eval-tokens") {
		t.Errorf("15 evaluation tokens for a context of 16: %v", err)
	}
	if err := d.CheckContext(99); err != nil {
		t.Errorf("100 tokens each for a context of 99: %v", err)
	}
	if err := d.CheckContext(100); err == nil || !errors.Is(err, text.ErrEmpty) {
		t.Errorf("100 tokens each for a context of 100: %v", err)
	}
}
