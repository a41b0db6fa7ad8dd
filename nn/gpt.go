package nn

import (
	"math"
	"math/rand/v2"

	"github.com/skyhive/skyhive/tensor"
)

// GPTConfig describes a GPT-style causal decoder language model.
type GPTConfig struct {
	Vocab   int     // token vocabulary
	Seq     int     // context length: the longest sequence the model takes
	Hidden  int     // hidden size
	Heads   int     // attention heads; Hidden must be divisible by Heads
	Layers  int     // decoder blocks
	FFN     int     // inner size of the feed-forward block (4·Hidden in GPT)
	Dropout float32 // dropout probability in training
}

// GPTMini is a GPT that trains in minutes on two cores: 4 blocks of hidden
// 128 with 4 heads and FFN 512, no dropout.
func GPTMini(vocab, seq int) GPTConfig {
	return GPTConfig{Vocab: vocab, Seq: seq, Hidden: 128, Heads: 4, Layers: 4, FFN: 512}
}

// GPTSmall is GPT-2 small's geometry (BERT-base's: 12 blocks of hidden 768,
// 12 heads, FFN 3072) with dropout 0.1.
func GPTSmall(vocab, seq int) GPTConfig {
	return GPTConfig{Vocab: vocab, Seq: seq, Hidden: 768, Heads: 12, Layers: 12, FFN: 3072, Dropout: 0.1}
}

// GPTMedium is GPT-2 medium's geometry, which is BERT-large's (24 blocks of
// hidden 1024, 16 heads, FFN 4096), with dropout 0.1.
func GPTMedium(vocab, seq int) GPTConfig {
	return GPTConfig{Vocab: vocab, Seq: seq, Hidden: 1024, Heads: 16, Layers: 24, FFN: 4096, Dropout: 0.1}
}

// Validate reports a configuration that cannot be built.
func (c GPTConfig) Validate() error {
	return validateTransformer("GPT", c, c.Vocab > 0 && c.Seq > 0, c.Hidden, c.Heads, c.Layers, c.FFN, c.Dropout)
}

// NumParams returns the number of trainable scalars GPT(c) has, without
// building it (the tied head adds none): token and position tables, per
// block two LayerNorms, four attention projections and the FFN, and the
// final LayerNorm. It is computed in float64 so that absurd sizes cannot
// overflow.
func (c GPTConfig) NumParams() float64 {
	h, f := float64(c.Hidden), float64(c.FFN)
	block := 2*2*h + 4*(h*h+h) + (h*f + f) + (f*h + h)
	return float64(c.Vocab)*h + float64(c.Seq)*h + float64(c.Layers)*block + 2*h
}

// GPT returns a GPT-2-style causal decoder language model on [batch, seq]
// float32 token ids (seq ≤ cfg.Seq), giving [batch, seq, Vocab] next-token
// logits; train it with SequenceCrossEntropy. The children, in order, are
//
//	0 "embed"  Embedding (token table [Vocab, Hidden], N(0, 0.02²))
//	1 "pos"    PositionalEmbedding ([Seq, Hidden], N(0, 0.01²))
//	2 "drop"   Dropout
//	3… "dec"   cfg.Layers pre-LN DecoderLayers
//	   "ln"    final LayerNorm
//	   "head"  TiedHead sharing the embedding's table
//
// As in GPT-2, the projections that write into the residual stream (each
// block's attention output and second FFN layer) are drawn with std
// 0.02/√(2·Layers). The table appears once in Params ("0.embed.weight");
// its gradient is the sum of the embedding's and the head's.
func GPT(cfg GPTConfig, rng *rand.Rand) (*Sequential, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	emb := NewEmbedding(cfg.Vocab, cfg.Hidden, 0.02, rng)
	s := NewSequential().
		Append("embed", emb).
		Append("pos", NewPositionalEmbedding(cfg.Seq, cfg.Hidden, 0.01, rng)).
		Append("drop", NewDropout(cfg.Dropout, rng))
	resid := float32(1 / math.Sqrt(2*float64(max(cfg.Layers, 1))))
	for range cfg.Layers {
		d := NewDecoderLayer(cfg.Hidden, cfg.Heads, cfg.FFN, cfg.Dropout, rng)
		tensor.Scale(resid, d.Attn.Wo.W.Value.Data)
		tensor.Scale(resid, d.FFN.FC2.W.Value.Data)
		s.Append("dec", d)
	}
	s.Append("ln", NewLayerNorm(cfg.Hidden, 1e-5)).Append("head", NewTiedHead(emb))
	return s, nil
}
