package nn

import (
	"math/rand/v2"
	"slices"

	"github.com/skyhive/skyhive/tensor"
)

// FFN is the position-wise feed-forward block Linear(h, f) → activation →
// Linear(f, h) ("fc1", "fc2"), applied on the last dimension.
type FFN struct {
	FC1           *Linear
	Act           Module
	FC2           *Linear
	Hidden, Inner int
}

// NewFFN returns a feed-forward block with the given activation (ReLU{} or
// GELU{}) whose weights are drawn from N(0, std²); std ≤ 0 selects He
// initialisation for fc1 and Xavier for fc2.
func NewFFN(hidden, inner int, act Module, std float64, rng *rand.Rand) *FFN {
	s1, s2 := std, std
	if std <= 0 {
		s1, s2 = HeStd(hidden), XavierStd(inner, hidden)
	}
	return &FFN{FC1: NewLinear(hidden, inner, s1, rng), Act: act, FC2: NewLinear(inner, hidden, s2, rng), Hidden: hidden, Inner: inner}
}

type ffnState struct{ s1, sa, s2 State }

// Forward computes fc2(act(fc1(x))).
func (f *FFN) Forward(c Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	h, s1 := f.FC1.Forward(c, x)
	a, sa := f.Act.Forward(c, h)
	y, s2 := f.FC2.Forward(c, a)
	return y, ffnState{s1, sa, s2}
}

// Backward runs the three layers backwards.
func (f *FFN) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	st := s.(ffnState)
	return f.FC1.Backward(st.s1, f.Act.Backward(st.sa, f.FC2.Backward(st.s2, dy)))
}

// Params returns fc1's and fc2's parameters.
func (f *FFN) Params() []*Param {
	return append(prefixed("fc1", f.FC1.Params()), prefixed("fc2", f.FC2.Params())...)
}

// Cost sums the three layers.
func (f *FFN) Cost(in []int) Cost {
	c1 := f.FC1.Cost(in)
	ca := f.Act.Cost(c1.OutShape)
	return c1.Add(ca).Add(f.FC2.Cost(ca.OutShape))
}

// EncoderLayer is one post-LN BERT encoder layer on [batch, seq, hidden]:
//
//	x = LN1(x + Dropout(Attention(x)))
//	x = LN2(x + Dropout(FFN(x)))       with FFN = Linear(h, ffn)·GELU·Linear(ffn, h)
//
// Parameters are named "attn.*", "ln1.*", "ffn.*", "ln2.*".
type EncoderLayer struct {
	Attn         *MultiHeadAttention
	Drop1, Drop2 *Dropout
	LN1, LN2     *LayerNorm
	FFN          *FFN
}

// NewEncoderLayer returns a BERT layer with N(0, 0.02²) weights and LayerNorm
// eps 1e-12 as in BERT.
func NewEncoderLayer(hidden, heads, ffn int, dropout float32, rng *rand.Rand) *EncoderLayer {
	const std = 0.02
	return &EncoderLayer{
		Attn:  NewMultiHeadAttention(hidden, heads, std, rng),
		Drop1: NewDropout(dropout, rng),
		LN1:   NewLayerNorm(hidden, 1e-12),
		FFN:   NewFFN(hidden, ffn, GELU{}, std, rng),
		Drop2: NewDropout(dropout, rng),
		LN2:   NewLayerNorm(hidden, 1e-12),
	}
}

type encoderState struct{ sa, sd1, sl1, sf, sd2, sl2 State }

// Forward runs the layer.
func (e *EncoderLayer) Forward(c Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	var st encoderState
	a, sa := e.Attn.Forward(c, x)
	a, st.sd1 = e.Drop1.Forward(c, a)
	st.sa = sa
	r1 := tensor.New(x.Shape...)
	tensor.Add(r1.Data, x.Data, a.Data)
	h, sl1 := e.LN1.Forward(c, r1)
	st.sl1 = sl1
	f, sf := e.FFN.Forward(c, h)
	st.sf = sf
	f, st.sd2 = e.Drop2.Forward(c, f)
	r2 := tensor.New(x.Shape...)
	tensor.Add(r2.Data, h.Data, f.Data)
	y, sl2 := e.LN2.Forward(c, r2)
	st.sl2 = sl2
	return y, st
}

// Backward runs the layer backwards through both residual branches.
func (e *EncoderLayer) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	st := s.(encoderState)
	dr2 := e.LN2.Backward(st.sl2, dy)
	dh := e.FFN.Backward(st.sf, e.Drop2.Backward(st.sd2, dr2))
	tensor.Add(dh.Data, dh.Data, dr2.Data)
	dr1 := e.LN1.Backward(st.sl1, dh)
	dx := e.Attn.Backward(st.sa, e.Drop1.Backward(st.sd1, dr1))
	tensor.Add(dx.Data, dx.Data, dr1.Data)
	return dx
}

// Params returns the layer's parameters.
func (e *EncoderLayer) Params() []*Param {
	var ps []*Param
	ps = append(ps, prefixed("attn", e.Attn.Params())...)
	ps = append(ps, prefixed("ln1", e.LN1.Params())...)
	ps = append(ps, prefixed("ffn", e.FFN.Params())...)
	ps = append(ps, prefixed("ln2", e.LN2.Params())...)
	return ps
}

// Cost sums the sub-layers and the two residual additions.
func (e *EncoderLayer) Cost(in []int) Cost {
	n := float64(numel(in))
	c := e.Attn.Cost(in).Add(e.Drop1.Cost(in)).Add(e.LN1.Cost(in)).Add(e.FFN.Cost(in)).Add(e.Drop2.Cost(in)).Add(e.LN2.Cost(in))
	c.ForwardFLOPs += 2 * n
	c.BackwardFLOPs += 2 * n
	c.OutShape = slices.Clone(in)
	return c
}

// Expert is the feed-forward expert of Learning@home's decentralized mixture
// of experts: y = x + FFN(LN(x)) with FFN = Linear(h, 4h)·ReLU·Linear(4h, h),
// i.e. a pre-LN residual block so that experts can be stacked and averaged
// without changing the scale of the hidden state. Parameters are "ln.*" and
// "ffn.*".
type Expert struct {
	LN  *LayerNorm
	FFN *FFN
}

// NewExpert returns an expert over hidden units with He/Xavier initialised
// weights.
func NewExpert(hidden int, rng *rand.Rand) *Expert {
	return &Expert{LN: NewLayerNorm(hidden, 1e-5), FFN: NewFFN(hidden, 4*hidden, ReLU{}, 0, rng)}
}

type expertState struct{ sl, sf State }

// Forward computes x + FFN(LN(x)).
func (e *Expert) Forward(c Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	h, sl := e.LN.Forward(c, x)
	f, sf := e.FFN.Forward(c, h)
	tensor.Add(f.Data, f.Data, x.Data)
	return f, expertState{sl, sf}
}

// Backward returns dy + LNᵀ(FFNᵀ(dy)).
func (e *Expert) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	st := s.(expertState)
	dx := e.LN.Backward(st.sl, e.FFN.Backward(st.sf, dy))
	tensor.Add(dx.Data, dx.Data, dy.Data)
	return dx
}

// Params returns the expert's parameters.
func (e *Expert) Params() []*Param {
	return append(prefixed("ln", e.LN.Params()), prefixed("ffn", e.FFN.Params())...)
}

// Cost sums LayerNorm, FFN and the residual addition.
func (e *Expert) Cost(in []int) Cost {
	n := float64(numel(in))
	c := e.LN.Cost(in).Add(e.FFN.Cost(in))
	c.ForwardFLOPs += n
	c.OutShape = slices.Clone(in)
	return c
}
