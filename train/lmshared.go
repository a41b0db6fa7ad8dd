// Helpers shared with other language-model trainers (the group-averaging
// peers of package averaging/peer): the same tokenization, split, model
// spec and reference perplexity as RunLM, so that a model trained there and
// one trained here are comparable.

package train

import (
	"errors"
	"fmt"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/text"
)

// LMData is a corpus tokenized and split for language modeling.
type LMData struct {
	// Tokenizer is the BPE tokenizer trained on a text corpus; nil for
	// token data, which comes tokenized.
	Tokenizer *text.Tokenizer
	// Vocab is the vocabulary size: the tokenizer's, or the token data's.
	Vocab int
	// Train and Val are the training and validation tokens (text.Split).
	Train, Val []int32
}

// TokenizeLM tokenizes corpus as RunLM does, without a checkpoint: a text
// corpus with a byte-level BPE of vocab tokens trained on it, token data as
// it is (its ids checked against corpus.Vocab); then it splits the tokens
// with text.Split(valFraction, seed). The same corpus, vocab, fraction and
// seed give the same tokenizer and split in every process.
func TokenizeLM(corpus Corpus, vocab int, valFraction float64, seed uint64) (LMData, error) {
	var d LMData
	var ids []int32
	switch {
	case corpus.Text != nil:
		if len(corpus.Text) == 0 {
			return d, fmt.Errorf("corpus %s: %w: there is no text to train on", corpus.Name, text.ErrEmpty)
		}
		if vocab < 256 {
			return d, fmt.Errorf("BPE vocabulary size %d: it must be at least 256 (the byte tokens) plus the merges, e.g. 1024", vocab)
		}
		tok, err := text.TrainBPE(corpus.Text, vocab)
		if err != nil {
			return d, err
		}
		d.Tokenizer, d.Vocab = tok, tok.VocabSize()
		ids = tok.Encode(corpus.Text)
	case len(corpus.Tokens) > 0:
		if corpus.Vocab <= 0 {
			return d, errors.New("a token corpus needs its vocabulary size")
		}
		for i, id := range corpus.Tokens {
			if id < 0 || int(id) >= corpus.Vocab {
				return d, fmt.Errorf("token id %d at position %d is outside the vocabulary of %d: give the vocabulary of the tokenizer that wrote the tokens", id, i, corpus.Vocab)
			}
		}
		d.Vocab, ids = corpus.Vocab, corpus.Tokens
	default:
		return d, fmt.Errorf("corpus %s: %w: no text or tokens to train on", corpus.Name, text.ErrEmpty)
	}
	var err error
	if d.Train, d.Val, err = text.Split(ids, valFraction, seed); err != nil {
		return d, fmt.Errorf("%w: read more text (--corpus-bytes)", err)
	}
	return d, nil
}

// LMSpec completes a language-model spec as RunLM does: a GPT size without
// parameters ("gpt-mini") gets ":VOCABxSEQ" (seq 0: models.DefaultSeq); a
// spec with parameters must have a vocabulary of at least vocab and, if
// seq is set, that context. It returns the full spec and its
// configuration.
func LMSpec(model string, vocab, seq int) (string, nn.GPTConfig, error) {
	return lmSpec(model, vocab, seq)
}

// UnigramPerplexity is the perplexity on eval of the add-one unigram
// distribution of train's tokens (ids below vocab), the scale RunLM
// reports next to a model's perplexity.
func UnigramPerplexity(train, eval []int32, vocab int) float64 {
	return unigramPerplexity(train, eval, vocab)
}
