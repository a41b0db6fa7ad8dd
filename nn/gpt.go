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
	// Untied gives the output head its own [Vocab, Hidden] weight instead
	// of sharing the token embedding's table. The default (false) is
	// GPT-2's tied head. A model split across machines (package pipeline)
	// is built untied: its first and last blocks live in different
	// processes, which cannot share one table.
	Untied bool
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
// building it: token and position tables, per block two LayerNorms, four
// attention projections and the FFN, the final LayerNorm, and the head's
// own weight when Untied (the tied head adds none). It is computed in float64 so that absurd sizes cannot
// overflow.
func (c GPTConfig) NumParams() float64 {
	h, f := float64(c.Hidden), float64(c.FFN)
	block := 2*2*h + 4*(h*h+h) + (h*f + f) + (f*h + h)
	n := float64(c.Vocab)*h + float64(c.Seq)*h + float64(c.Layers)*block + 2*h
	if c.Untied {
		n += float64(c.Vocab) * h
	}
	return n
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
//	   "head"  TiedHead sharing the embedding's table, or with
//	           cfg.Untied a Head of its own weight
//
// As in GPT-2, the projections that write into the residual stream (each
// block's attention output and second FFN layer) are drawn with std
// 0.02/√(2·Layers). The table appears once in Params ("0.embed.weight");
// its gradient is the sum of the embedding's and the head's. An untied
// head's weight ("N.head.weight") is drawn like the table, N(0, 0.02²),
// after every other parameter, so an untied model starts with the same
// values as the tied one of the same generator, and the head equal to the
// table.
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
	s.Append("ln", NewLayerNorm(cfg.Hidden, 1e-5))
	if cfg.Untied {
		s.Append("head", NewHead(cfg.Vocab, cfg.Hidden, 0.02, rng))
	} else {
		s.Append("head", NewTiedHead(emb))
	}
	return s, nil
}

// Head is an untied output layer: logits = x·Weightᵀ on the last
// dimension, [.., Hidden] → [.., Vocab], with a [Vocab, Hidden] weight of
// its own and no bias. It computes what a TiedHead does, but owns its
// weight: Params lists it and the optimizer updates it apart from any
// embedding.
type Head struct {
	Vocab, Hidden int
	Weight        *Param
}

// NewHead returns a head whose weight is drawn from N(0, std²).
func NewHead(vocab, hidden int, std float64, rng *rand.Rand) *Head {
	w := tensor.New(vocab, hidden)
	fillNormal(w.Data, rng, std)
	return &Head{Vocab: vocab, Hidden: hidden, Weight: newParam("weight", w)}
}

// tied is the same product as a TiedHead over the head's own weight.
func (h *Head) tied() *TiedHead { return &TiedHead{Vocab: h.Vocab, Hidden: h.Hidden, Table: h.Weight} }

// Forward computes x·Weightᵀ.
func (h *Head) Forward(c Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	checkLast("Head", x.Shape, h.Hidden)
	return h.tied().Forward(c, x)
}

// Backward adds dyᵀ·x into the weight's gradient and returns dy·Weight.
func (h *Head) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	return h.tied().Backward(s, dy)
}

// Params returns the weight.
func (h *Head) Params() []*Param { return []*Param{h.Weight} }

// Cost is a TiedHead's plus the weight's Vocab·Hidden parameters.
func (h *Head) Cost(in []int) Cost {
	checkLast("Head", in, h.Hidden)
	c := h.tied().Cost(in)
	c.Params = int64(h.Vocab) * int64(h.Hidden)
	return c
}
