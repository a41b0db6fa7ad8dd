package text

import (
	"math"
	"testing"
)

func TestBigramHandComputed(t *testing.T) {
	// Pairs of 0 1 0 1 1: (0,1) twice, (1,0) once, (1,1) once. With k = 1
	// and V = 2: P(1|0) = 3/4, P(0|1) = P(1|1) = 2/4. The four predictions
	// have probabilities 3/4, 1/2, 3/4, 1/2, so the perplexity is
	// (3/4 · 1/2)^(-1/2).
	tokens := []int32{0, 1, 0, 1, 1}
	m, err := TrainBigram(tokens, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	pp, err := m.Perplexity(tokens)
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 / math.Sqrt(0.375); math.Abs(pp-want) > 1e-12 {
		t.Errorf("perplexity %v, want %v", pp, want)
	}
	// k = 0.5 on an unseen sequence: P(0|0) = 0.5/3, P(0|1) = 1.5/3.
	m, err = TrainBigram(tokens, 2, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	ce, err := m.CrossEntropy([]int32{1, 0, 0})
	if err != nil {
		t.Fatal(err)
	}
	if want := -(math.Log(1.5/3) + math.Log(0.5/3)) / 2; math.Abs(ce-want) > 1e-12 {
		t.Errorf("cross-entropy %v, want %v", ce, want)
	}
}

func TestBigramRowsSumToOne(t *testing.T) {
	tokens := []int32{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9}
	m, err := TrainBigram(tokens, 10, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	for a := range int32(10) {
		var sum float64
		for b := range int32(10) {
			sum += m.Prob(a, b)
		}
		if math.Abs(sum-1) > 1e-12 {
			t.Errorf("row %d sums to %v", a, sum)
		}
	}
}

func TestBigramErrors(t *testing.T) {
	if _, err := TrainBigram([]int32{0, 5}, 5, 1); err == nil {
		t.Error("id 5 accepted with vocabulary 5")
	}
	for _, k := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		if _, err := TrainBigram([]int32{0, 1}, 2, k); err == nil {
			t.Errorf("k = %v accepted", k)
		}
	}
	if _, err := TrainBigram([]int32{0}, 2, 1); err == nil {
		t.Error("one token accepted")
	}
	m, _ := TrainBigram([]int32{0, 1}, 2, 1)
	if _, err := m.Perplexity([]int32{0, 2}); err == nil {
		t.Error("evaluation with id 2 accepted")
	}
}

func TestBigramGCIDE(t *testing.T) {
	text := loadRealGCIDE(t, 1<<20)
	tok, err := TrainBPE(text, 512)
	if err != nil {
		t.Fatal(err)
	}
	train, val, err := Split(tok.Encode(text), 0.1, 1)
	if err != nil {
		t.Fatal(err)
	}
	m, err := TrainBigram(train, tok.VocabSize(), 0.1)
	if err != nil {
		t.Fatal(err)
	}
	pp, err := m.Perplexity(val)
	if err != nil {
		t.Fatal(err)
	}
	// Far better than uniform over the vocabulary, worse than on train.
	trainPP, _ := m.Perplexity(train)
	if !(pp < float64(tok.VocabSize())/4 && trainPP < pp) {
		t.Errorf("validation perplexity %.1f, train %.1f, vocabulary %d", pp, trainPP, tok.VocabSize())
	}
	t.Logf("bigram perplexity: train %.2f, validation %.2f (vocabulary %d)", trainPP, pp, tok.VocabSize())
}
