// Helpers shared with other language-model trainers (the group-averaging
// peers of package averaging/peer): the same tokenization, split, model
// spec and reference perplexity as RunLM, so that a model trained there and
// one trained here are comparable.

package train

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"time"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/text"
)

// LMData is a corpus tokenized and split for language modeling.
type LMData struct {
	// Tokenizer is the BPE tokenizer that encoded a text corpus; nil for
	// token data, which comes tokenized.
	Tokenizer *text.Tokenizer
	// Vocab is the vocabulary size: the tokenizer's, or the token data's.
	Vocab int
	// Train and Val are the training and validation tokens (text.Split).
	Train, Val []int32
	// TokenizeSeconds is how long tokenizing took (training the BPE and
	// encoding).
	TokenizeSeconds float64
}

// Tokens is the number of tokens of the corpus, training and validation.
func (d LMData) Tokens() int { return len(d.Train) + len(d.Val) }

// TokenizeOptions configures Tokenize.
type TokenizeOptions struct {
	// Vocab is the size of the byte-level BPE trained on a text corpus: at
	// least 256 (the byte tokens) plus the merges.
	Vocab int
	// Tokenizer, if set, encodes a text corpus instead of a BPE trained on
	// it (a resumed run's).
	Tokenizer *text.Tokenizer
	// ValFraction of the tokens is held out for validation (0.1 when 0),
	// split with Seed by text.Split.
	ValFraction float64
	Seed        uint64
	// Log, if set, receives a line when a tokenizer is trained.
	Log io.Writer
}

// valFraction is the share held out: ValFraction, 0.1 when 0.
func (o TokenizeOptions) valFraction() float64 {
	if o.ValFraction == 0 {
		return 0.1
	}
	return o.ValFraction
}

// Tokenize is the language-model data path of every command: a text corpus
// is encoded with a byte-level BPE of o.Vocab tokens trained on it (or with
// o.Tokenizer), token data is taken as it is after checking every id
// against corpus.Vocab; the tokens are then split with
// text.Split(o.ValFraction, o.Seed). The same corpus and options give the
// same tokenizer and split in every process.
func Tokenize(corpus Corpus, o TokenizeOptions) (LMData, error) {
	var d LMData
	o.ValFraction = o.valFraction()
	t0 := time.Now()
	var ids []int32
	switch {
	case corpus.Text != nil:
		if len(corpus.Text) == 0 {
			return d, fmt.Errorf("corpus %s: %w: there is no text to train on", corpus.Name, text.ErrEmpty)
		}
		tok := o.Tokenizer
		if tok == nil {
			if o.Vocab < 256 {
				return d, fmt.Errorf("BPE vocabulary size %d: it must be at least 256 (the byte tokens) plus the merges, e.g. 1024", o.Vocab)
			}
			if o.Log != nil {
				fmt.Fprintf(o.Log, "training a BPE tokenizer of %d tokens on %d bytes of %s\n", o.Vocab, len(corpus.Text), corpus.Name)
			}
			var err error
			if tok, err = text.TrainBPE(corpus.Text, o.Vocab); err != nil {
				return d, err
			}
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
	d.TokenizeSeconds = time.Since(t0).Seconds()
	var err error
	if d.Train, d.Val, err = text.Split(ids, o.ValFraction, o.Seed); err != nil {
		return d, fmt.Errorf("%w: read more text (--corpus-bytes)", err)
	}
	return d, nil
}

// TokenizeLM is Tokenize with a BPE of vocab tokens, valFraction of the
// tokens held out with seed.
func TokenizeLM(corpus Corpus, vocab int, valFraction float64, seed uint64) (LMData, error) {
	return Tokenize(corpus, TokenizeOptions{Vocab: vocab, ValFraction: valFraction, Seed: seed})
}

// Signature names the data's token ids, so that models trained on ids
// that mean other things are not mixed: "bpe-HASH" (FNV-1a, 64 bits, of
// the tokenizer's merges written "LEFT,RIGHT;"), or "tokens" for token
// data, whose tokenizer Skyhive does not know.
func (d LMData) Signature() string {
	if d.Tokenizer == nil {
		return "tokens"
	}
	h := fnv.New64a()
	for _, p := range d.Tokenizer.Merges() {
		fmt.Fprintf(h, "%d,%d;", p.Left, p.Right)
	}
	return fmt.Sprintf("bpe-%016x", h.Sum64())
}

// CheckContext refuses data that cannot train or evaluate a context of
// seq tokens: the training and the validation tokens must each hold a
// window of seq tokens and its next token.
func (d LMData) CheckContext(seq int) error {
	if need := seq + 1; len(d.Train) < need || len(d.Val) < need {
		return fmt.Errorf("the corpus gives %d training and %d validation tokens, but each needs at least context + 1 = %d: %w; read more text (--corpus-bytes) or use a shorter context (--seq)",
			len(d.Train), len(d.Val), need, text.ErrEmpty)
	}
	return nil
}

// EvalCut is the one rule for the validation tokens a language model is
// evaluated on (--eval-tokens): at most evalTokens predicted tokens (0:
// no bound), which are read from the first evalTokens+1 ids of val, since
// a window's first id is only context.
func EvalCut(val []int32, evalTokens int) []int32 {
	if evalTokens > 0 && len(val) > evalTokens+1 {
		return val[:evalTokens+1]
	}
	return val
}

// EvalIDs are the validation ids a causal language model of context seq is
// evaluated on: EvalCut(Val, evalTokens), then whole windows of seq
// predicted tokens (rows·seq+1 ids), so that reference models can predict
// exactly the tokens the model does. It is an error if not one window
// fits.
func (d LMData) EvalIDs(evalTokens, seq int) ([]int32, error) {
	ids := EvalCut(d.Val, evalTokens)
	rows := (len(ids) - 1) / max(seq, 1)
	if seq < 1 || rows < 1 {
		return nil, fmt.Errorf("%d evaluation tokens are fewer than a context of %d: %w; raise --eval-tokens or use a shorter context (--seq)", max(len(ids)-1, 0), seq, text.ErrEmpty)
	}
	return ids[:rows*seq+1], nil
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
