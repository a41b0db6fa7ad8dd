package text

import (
	"fmt"
	"math"
)

// Bigram is a count-based bigram language model with add-k smoothing:
//
//	P(b | a) = (count(a, b) + K) / (count(a) + K·Vocab)
//
// where count(a, b) is how often b follows a in the training tokens and
// count(a) how often a is followed by anything. It is the reference a
// trained language model must beat.
type Bigram struct {
	Vocab int
	K     float64
	pairs map[uint64]int64 // a<<32 | b -> count(a, b)
	from  []int64          // count(a)
}

// TrainBigram counts the bigrams of tokens, whose ids must be in
// [0, vocab). k must be positive, so that unseen pairs keep a nonzero
// probability.
func TrainBigram(tokens []int32, vocab int, k float64) (*Bigram, error) {
	if vocab < 1 || vocab > MaxVocab {
		return nil, fmt.Errorf("text: bigram vocabulary size %d outside [1, %d]", vocab, MaxVocab)
	}
	if !(k > 0) || math.IsInf(k, 0) {
		return nil, fmt.Errorf("text: bigram smoothing k = %v must be positive and finite", k)
	}
	if len(tokens) < 2 {
		return nil, fmt.Errorf("text: a bigram model needs at least 2 tokens, got %d: %w", len(tokens), ErrEmpty)
	}
	if err := checkIDs(tokens, vocab); err != nil {
		return nil, err
	}
	m := &Bigram{Vocab: vocab, K: k, pairs: map[uint64]int64{}, from: make([]int64, vocab)}
	for i := 1; i < len(tokens); i++ {
		a, b := tokens[i-1], tokens[i]
		m.pairs[uint64(a)<<32|uint64(b)]++
		m.from[a]++
	}
	return m, nil
}

// Prob returns P(b | a). It panics if a or b is outside the vocabulary.
func (m *Bigram) Prob(a, b int32) float64 {
	c := m.pairs[uint64(a)<<32|uint64(b)]
	return (float64(c) + m.K) / (float64(m.from[a]) + m.K*float64(m.Vocab))
}

// CrossEntropy returns the mean negative log-likelihood, in nats per token,
// of predicting each token of tokens from the one before it: the quantity a
// language model's training loss measures.
func (m *Bigram) CrossEntropy(tokens []int32) (float64, error) {
	if len(tokens) < 2 {
		return 0, fmt.Errorf("text: evaluating a bigram model needs at least 2 tokens, got %d: %w", len(tokens), ErrEmpty)
	}
	if err := checkIDs(tokens, m.Vocab); err != nil {
		return 0, err
	}
	var nll float64
	for i := 1; i < len(tokens); i++ {
		nll -= math.Log(m.Prob(tokens[i-1], tokens[i]))
	}
	return nll / float64(len(tokens)-1), nil
}

// Perplexity returns exp(CrossEntropy(tokens)).
func (m *Bigram) Perplexity(tokens []int32) (float64, error) {
	ce, err := m.CrossEntropy(tokens)
	if err != nil {
		return 0, err
	}
	return math.Exp(ce), nil
}

// checkIDs reports the first id outside [0, vocab).
func checkIDs(tokens []int32, vocab int) error {
	for i, t := range tokens {
		if t < 0 || int(t) >= vocab {
			return fmt.Errorf("text: token id %d at position %d is outside the vocabulary of %d", t, i, vocab)
		}
	}
	return nil
}
