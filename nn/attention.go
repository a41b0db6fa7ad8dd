package nn

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/skyhive/skyhive/tensor"
)

// MultiHeadAttention is BERT's multi-head self-attention on [batch, seq,
// hidden] inputs: Q, K, V projections ("wq", "wk", "wv"), per head
// softmax(Q·Kᵀ/√d)·V with d = hidden/heads, and an output projection ("wo").
//
// If Ctx.Mask is set ([batch, seq], 1 = token, 0 = padding), padded keys get
// zero attention weight. Padded query positions still produce outputs (they
// attend to the real tokens); losses and pooling should ignore them.
//
// If Causal is set, query position i attends only to key positions j ≤ i
// (GPT's masked self-attention), so the output at position i does not
// depend on the input at any later position. Causal and Ctx.Mask combine: a
// key must be both earlier (or equal) and real.
type MultiHeadAttention struct {
	Hidden, Heads  int
	Causal         bool
	Wq, Wk, Wv, Wo *Linear
}

// NewMultiHeadAttention returns an attention layer whose projections are
// drawn from N(0, std²) (BERT uses 0.02).
func NewMultiHeadAttention(hidden, heads int, std float64, rng *rand.Rand) *MultiHeadAttention {
	if heads <= 0 || hidden%heads != 0 {
		panic(fmt.Sprintf("nn: hidden %d not divisible by %d heads", hidden, heads))
	}
	return &MultiHeadAttention{
		Hidden: hidden,
		Heads:  heads,
		Wq:     NewLinear(hidden, hidden, std, rng),
		Wk:     NewLinear(hidden, hidden, std, rng),
		Wv:     NewLinear(hidden, hidden, std, rng),
		Wo:     NewLinear(hidden, hidden, std, rng),
	}
}

// NewCausalSelfAttention returns a MultiHeadAttention with Causal set: GPT's
// masked self-attention, whose projections are drawn from N(0, std²).
func NewCausalSelfAttention(hidden, heads int, std float64, rng *rand.Rand) *MultiHeadAttention {
	a := NewMultiHeadAttention(hidden, heads, std, rng)
	a.Causal = true
	return a
}

type attentionState struct {
	batch, seq     int
	q, k, v        *tensor.Tensor
	p              []float32 // attention weights [batch, heads, seq, seq]
	sq, sk, sv, so State
}

func (a *MultiHeadAttention) dims(shape []int) (batch, seq int) {
	if len(shape) != 3 || shape[2] != a.Hidden {
		panic(fmt.Sprintf("nn: attention expects [batch, seq, %d], got %v", a.Hidden, shape))
	}
	return shape[0], shape[1]
}

func maskData(c Ctx, batch, seq int) []float32 {
	if c.Mask == nil {
		return nil
	}
	if c.Mask.Len() != batch*seq {
		panic(fmt.Sprintf("nn: attention mask has shape %v, want [%d, %d]", c.Mask.Shape, batch, seq))
	}
	return c.Mask.Data
}

// forEachHead calls fn for every (batch, head) pair, in order or, if
// concurrent, spread over GOMAXPROCS goroutines; fn must then only write
// memory that belongs to its pair. GEMMs are issued in order: the default
// engine is multi-threaded already, and running many small products
// concurrently on the pure-Go engine measured slower.
func forEachHead(b, nh int, concurrent bool, fn func(bi, hi int)) {
	grain := b * nh
	if concurrent {
		grain = 1
	}
	parallelFor(b*nh, grain, func(lo, hi int) {
		for bh := lo; bh < hi; bh++ {
			fn(bh/nh, bh%nh)
		}
	})
}

// Forward computes self-attention of x.
func (a *MultiHeadAttention) Forward(c Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	b, s := a.dims(x.Shape)
	h, nh := a.Hidden, a.Heads
	d := h / nh
	mask := maskData(c, b, s)
	q, sq := a.Wq.Forward(c, x)
	k, sk := a.Wk.Forward(c, x)
	v, sv := a.Wv.Forward(c, x)
	scale := float32(1 / math.Sqrt(float64(d)))
	p := make([]float32, b*nh*s*s)
	ctxOut := tensor.New(b, s, h)
	softmax := func(bi, hi int) {
		var keep []float32
		if mask != nil {
			keep = mask[bi*s : (bi+1)*s]
		}
		softmaxRowsMasked(p[(bi*nh+hi)*s*s:(bi*nh+hi+1)*s*s], s, s, keep, a.Causal)
	}
	// P = softmax(scale·Q·Kᵀ) over unmasked keys; context = P·V. Masked
	// weights are exactly 0, so the backward pass needs no mask: the softmax
	// gradient p ⊙ (dp − Σ dp·p) is 0 wherever p is.
	forEachHead(b, nh, false, func(bi, hi int) {
		off := bi*s*h + hi*d
		tensor.Gemm(false, true, s, s, d, scale, q.Data[off:], h, k.Data[off:], h, 0, p[(bi*nh+hi)*s*s:], s)
	})
	forEachHead(b, nh, true, softmax)
	forEachHead(b, nh, false, func(bi, hi int) {
		off := bi*s*h + hi*d
		tensor.Gemm(false, false, s, d, s, 1, p[(bi*nh+hi)*s*s:], s, v.Data[off:], h, 0, ctxOut.Data[off:], h)
	})
	y, so := a.Wo.Forward(c, ctxOut)
	return y, &attentionState{batch: b, seq: s, q: q, k: k, v: v, p: p, sq: sq, sk: sk, sv: sv, so: so}
}

// Backward returns the input gradient and accumulates the projections'
// gradients.
func (a *MultiHeadAttention) Backward(st State, dy *tensor.Tensor) *tensor.Tensor {
	s0 := st.(*attentionState)
	b, s := s0.batch, s0.seq
	h, nh := a.Hidden, a.Heads
	d := h / nh
	scale := float32(1 / math.Sqrt(float64(d)))
	dctx := a.Wo.Backward(s0.so, dy)
	dq := tensor.New(b, s, h)
	dk := tensor.New(b, s, h)
	dv := tensor.New(b, s, h)
	dp := make([]float32, len(s0.p))
	softmaxBack := func(bi, hi int) {
		bh := (bi*nh + hi) * s * s
		softmaxBackwardRows(dp[bh:bh+s*s], s0.p[bh:bh+s*s], s, s)
	}
	forEachHead(b, nh, false, func(bi, hi int) {
		off := bi*s*h + hi*d
		bh := (bi*nh + hi) * s * s
		// dV = Pᵀ·dctx, dP = dctx·Vᵀ.
		tensor.Gemm(true, false, s, d, s, 1, s0.p[bh:], s, dctx.Data[off:], h, 0, dv.Data[off:], h)
		tensor.Gemm(false, true, s, s, d, 1, dctx.Data[off:], h, s0.v.Data[off:], h, 0, dp[bh:], s)
	})
	forEachHead(b, nh, true, softmaxBack)
	forEachHead(b, nh, false, func(bi, hi int) {
		off := bi*s*h + hi*d
		bh := (bi*nh + hi) * s * s
		// scores = scale·Q·Kᵀ: dQ = scale·dS·K, dK = scale·dSᵀ·Q.
		tensor.Gemm(false, false, s, d, s, scale, dp[bh:], s, s0.k.Data[off:], h, 0, dq.Data[off:], h)
		tensor.Gemm(true, false, s, d, s, scale, dp[bh:], s, s0.q.Data[off:], h, 0, dk.Data[off:], h)
	})
	dx := a.Wq.Backward(s0.sq, dq)
	tensor.Add(dx.Data, dx.Data, a.Wk.Backward(s0.sk, dk).Data)
	tensor.Add(dx.Data, dx.Data, a.Wv.Backward(s0.sv, dv).Data)
	return dx
}

// Params returns the four projections' parameters.
func (a *MultiHeadAttention) Params() []*Param {
	var ps []*Param
	ps = append(ps, prefixed("wq", a.Wq.Params())...)
	ps = append(ps, prefixed("wk", a.Wk.Params())...)
	ps = append(ps, prefixed("wv", a.Wv.Params())...)
	ps = append(ps, prefixed("wo", a.Wo.Params())...)
	return ps
}

// Cost counts the four projections plus the two batched attention GEMMs
// (2·b·s²·h FLOPs each forward) and the softmax.
func (a *MultiHeadAttention) Cost(in []int) Cost {
	b, s := a.dims(in)
	lc := a.Wq.Cost(in)
	att := 2 * 2 * float64(b) * float64(s) * float64(s) * float64(a.Hidden)
	sm := float64(b * a.Heads * s * s)
	return Cost{
		ForwardFLOPs:  4*lc.ForwardFLOPs + att + 5*sm,
		BackwardFLOPs: 4*lc.BackwardFLOPs + 2*att + 4*sm,
		Params:        4 * lc.Params,
		// x (shared by Q, K, V), q, k, v, the context and the weights.
		ActivationBytes: int64(5*b*s*a.Hidden+b*a.Heads*s*s) * f32,
		OutShape:        []int{b, s, a.Hidden},
	}
}
