package nn

import (
	"fmt"
	"math/rand/v2"
)

// BERTMLMConfig describes a BERT masked language model over token ids.
//
// Vocab counts every id the model takes and scores, the [MASK] token
// included: the model reserves its last id, Vocab−1 (MaskID), as [MASK],
// so a model for a tokenizer of V tokens has Vocab = V+1 and MaskID = V.
type BERTMLMConfig struct {
	Vocab   int     // token vocabulary, [MASK] included
	Seq     int     // context length: the longest sequence the model takes
	Hidden  int     // hidden size
	Heads   int     // attention heads; Hidden must be divisible by Heads
	Layers  int     // encoder layers
	FFN     int     // inner size of the feed-forward block (4·Hidden in BERT)
	Dropout float32 // dropout probability in training
	// Untied gives the output head its own [Vocab, Hidden] weight instead
	// of sharing the token embedding's table; the default (false) is
	// BERT's tied head.
	Untied bool
}

// BERTMLMMini is a BERT masked language model that trains in minutes on two
// cores: 4 layers of hidden 128 with 4 heads and FFN 512, no dropout.
func BERTMLMMini(vocab, seq int) BERTMLMConfig {
	return BERTMLMConfig{Vocab: vocab, Seq: seq, Hidden: 128, Heads: 4, Layers: 4, FFN: 512}
}

// BERTMLMBase is BERT-base's geometry (12 layers of hidden 768, 12 heads,
// FFN 3072) with dropout 0.1.
func BERTMLMBase(vocab, seq int) BERTMLMConfig {
	return BERTMLMConfig{Vocab: vocab, Seq: seq, Hidden: 768, Heads: 12, Layers: 12, FFN: 3072, Dropout: 0.1}
}

// BERTMLMLarge is BERT-large's geometry (24 layers of hidden 1024, 16
// heads, FFN 4096) with dropout 0.1.
func BERTMLMLarge(vocab, seq int) BERTMLMConfig {
	return BERTMLMConfig{Vocab: vocab, Seq: seq, Hidden: 1024, Heads: 16, Layers: 24, FFN: 4096, Dropout: 0.1}
}

// MaskID is the id of the [MASK] token: the last of the vocabulary.
func (c BERTMLMConfig) MaskID() int32 { return int32(c.Vocab - 1) }

// Validate reports a configuration that cannot be built. The vocabulary
// must hold at least one token besides [MASK].
func (c BERTMLMConfig) Validate() error {
	if c.Vocab == 1 {
		return fmt.Errorf("nn: BERT MLM config: vocabulary %d leaves no token besides [MASK]", c.Vocab)
	}
	return validateTransformer("BERT MLM", c, c.Vocab > 0 && c.Seq > 0, c.Hidden, c.Heads, c.Layers, c.FFN, c.Dropout)
}

// NumParams returns the number of trainable scalars BERTMLM(c) has, without
// building it: token and position tables, the embedding LayerNorm, per
// layer four attention projections, the FFN and two LayerNorms, the MLM
// transform (a Linear of Hidden² + Hidden and its LayerNorm), and the
// head's own weight when Untied. It is computed in float64 so that absurd
// sizes cannot overflow.
func (c BERTMLMConfig) NumParams() float64 {
	h, f := float64(c.Hidden), float64(c.FFN)
	layer := 4*(h*h+h) + (h*f + f) + (f*h + h) + 2*2*h
	n := float64(c.Vocab)*h + float64(c.Seq)*h + 2*h + float64(c.Layers)*layer + (h*h + h) + 2*h
	if c.Untied {
		n += float64(c.Vocab) * h
	}
	return n
}

// BERTMLM returns a BERT masked language model on [batch, seq] float32
// token ids (seq ≤ cfg.Seq), giving [batch, seq, Vocab] logits at every
// position; train it with MaskedSequenceCrossEntropy on the positions that
// were masked. Attention is bidirectional (no causal mask): every position
// sees the whole sequence. The children, in order, are
//
//	0 "embed"  Embedding (token table [Vocab, Hidden])
//	1 "pos"    PositionalEmbedding ([Seq, Hidden])
//	2 "ln"     LayerNorm (eps 1e-12)
//	3 "drop"   Dropout
//	4… "enc"   cfg.Layers post-LN EncoderLayers
//	   "dense" Linear(Hidden, Hidden)  \
//	   "gelu"  GELU                     > BERT's MLM transform
//	   "ln"    final LayerNorm         /  (eps 1e-12)
//	   "head"  TiedHead sharing the embedding's table, or with
//	           cfg.Untied a Head of its own weight
//
// Every weight is drawn from N(0, 0.02²) as in BERT, biases are zero and
// LayerNorms start as the identity. Unlike BERT's, the head has no output
// bias, as GPT's has none. An untied head's weight is drawn after every
// other parameter, so an untied model starts with the same values as the
// tied one of the same generator.
func BERTMLM(cfg BERTMLMConfig, rng *rand.Rand) (*Sequential, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	const std = 0.02
	emb := NewEmbedding(cfg.Vocab, cfg.Hidden, std, rng)
	s := NewSequential().
		Append("embed", emb).
		Append("pos", NewPositionalEmbedding(cfg.Seq, cfg.Hidden, std, rng)).
		Append("ln", NewLayerNorm(cfg.Hidden, 1e-12)).
		Append("drop", NewDropout(cfg.Dropout, rng))
	for range cfg.Layers {
		s.Append("enc", NewEncoderLayer(cfg.Hidden, cfg.Heads, cfg.FFN, cfg.Dropout, rng))
	}
	s.Append("dense", NewLinear(cfg.Hidden, cfg.Hidden, std, rng)).
		Append("gelu", GELU{}).
		Append("ln", NewLayerNorm(cfg.Hidden, 1e-12))
	if cfg.Untied {
		s.Append("head", NewHead(cfg.Vocab, cfg.Hidden, std, rng))
	} else {
		s.Append("head", NewTiedHead(emb))
	}
	return s, nil
}
