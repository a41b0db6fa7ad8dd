package nn

import (
	"math/rand/v2"
	"slices"

	"github.com/skyhive/skyhive/tensor"
)

// DecoderLayer is one pre-LN GPT decoder block on [batch, seq, hidden]:
//
//	h = x + Dropout(CausalAttention(LN1(x)))
//	y = h + Dropout(FFN(LN2(h)))             with FFN = Linear(h, ffn)·GELU·Linear(ffn, h)
//
// Unlike the post-LN EncoderLayer, the residual stream is never normalised
// inside the block, which is what lets deep GPT stacks train without
// warm-up tricks; the model adds one final LayerNorm after the last block.
// Parameters are named "ln1.*", "attn.*", "ln2.*", "ffn.*".
type DecoderLayer struct {
	LN1, LN2     *LayerNorm
	Attn         *MultiHeadAttention
	FFN          *FFN
	Drop1, Drop2 *Dropout
}

// NewDecoderLayer returns a GPT block with N(0, 0.02²) weights, causal
// attention and LayerNorm eps 1e-5, as in GPT-2. (GPT additionally shrinks
// the two projections that write into the residual stream; see GPT.)
func NewDecoderLayer(hidden, heads, ffn int, dropout float32, rng *rand.Rand) *DecoderLayer {
	const std = 0.02
	return &DecoderLayer{
		LN1:   NewLayerNorm(hidden, 1e-5),
		Attn:  NewCausalSelfAttention(hidden, heads, std, rng),
		Drop1: NewDropout(dropout, rng),
		LN2:   NewLayerNorm(hidden, 1e-5),
		FFN:   NewFFN(hidden, ffn, GELU{}, std, rng),
		Drop2: NewDropout(dropout, rng),
	}
}

type decoderState struct{ sl1, sa, sd1, sl2, sf, sd2 State }

// Forward runs the block.
func (d *DecoderLayer) Forward(c Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	var st decoderState
	n1, sl1 := d.LN1.Forward(c, x)
	a, sa := d.Attn.Forward(c, n1)
	a, sd1 := d.Drop1.Forward(c, a)
	// a is this block's own allocation (the attention output or the dropout
	// of it) and no state holds it, so the residual can be added in place.
	tensor.Add(a.Data, a.Data, x.Data)
	n2, sl2 := d.LN2.Forward(c, a)
	f, sf := d.FFN.Forward(c, n2)
	f, sd2 := d.Drop2.Forward(c, f)
	tensor.Add(f.Data, f.Data, a.Data)
	st.sl1, st.sa, st.sd1, st.sl2, st.sf, st.sd2 = sl1, sa, sd1, sl2, sf, sd2
	return f, st
}

// Backward runs the block backwards through both residual branches.
func (d *DecoderLayer) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	st := s.(decoderState)
	// dh = dy + LN2ᵀ(FFNᵀ(Dropᵀ(dy))); LN2.Backward allocates its result.
	dh := d.LN2.Backward(st.sl2, d.FFN.Backward(st.sf, d.Drop2.Backward(st.sd2, dy)))
	tensor.Add(dh.Data, dh.Data, dy.Data)
	dx := d.LN1.Backward(st.sl1, d.Attn.Backward(st.sa, d.Drop1.Backward(st.sd1, dh)))
	tensor.Add(dx.Data, dx.Data, dh.Data)
	return dx
}

// Params returns the block's parameters.
func (d *DecoderLayer) Params() []*Param {
	var ps []*Param
	ps = append(ps, prefixed("ln1", d.LN1.Params())...)
	ps = append(ps, prefixed("attn", d.Attn.Params())...)
	ps = append(ps, prefixed("ln2", d.LN2.Params())...)
	ps = append(ps, prefixed("ffn", d.FFN.Params())...)
	return ps
}

// Cost sums the sub-layers and the two residual additions.
func (d *DecoderLayer) Cost(in []int) Cost {
	n := float64(numel(in))
	c := d.LN1.Cost(in).Add(d.Attn.Cost(in)).Add(d.Drop1.Cost(in)).Add(d.LN2.Cost(in)).Add(d.FFN.Cost(in)).Add(d.Drop2.Cost(in))
	c.ForwardFLOPs += 2 * n
	c.BackwardFLOPs += 2 * n
	c.OutShape = slices.Clone(in)
	return c
}
