package nn

import (
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/skyhive/skyhive/tensor"
)

// Dropout zeroes each element with probability P during training and scales
// the survivors by 1/(1−P) (inverted dropout); at inference (Ctx.Train
// false) or with P == 0 it is the identity. The random stream is the
// layer's own, seeded at construction, so a run is reproducible given the
// order of Forward calls. Forward is safe for concurrent use. In identity
// mode Forward returns x itself and Backward returns dy itself.
type Dropout struct {
	P float32

	mu  sync.Mutex
	rng *rand.Rand
}

// NewDropout returns a Dropout layer whose private random stream is seeded
// from rng.
func NewDropout(p float32, rng *rand.Rand) *Dropout {
	if p < 0 || p >= 1 {
		panic("nn: dropout probability must be in [0, 1)")
	}
	return &Dropout{P: p, rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))}
}

type dropoutState struct{ mask []float32 } // nil mask: identity

// Forward applies a fresh random mask when training.
func (d *Dropout) Forward(c Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	if !c.Train || d.P == 0 {
		return x, dropoutState{}
	}
	mask := make([]float32, x.Len())
	scale := 1 / (1 - d.P)
	// Each 64-bit draw gives four 16-bit uniforms; an element survives if
	// its uniform is at least P·2¹⁶ (P is thus rounded to a multiple of
	// 2⁻¹⁶).
	thr := uint64(float64(d.P)*65536 + 0.5)
	d.mu.Lock()
	for i := 0; i < len(mask); i += 4 {
		u := d.rng.Uint64()
		for j := i; j < min(i+4, len(mask)); j++ {
			if u&0xffff >= thr {
				mask[j] = scale
			}
			u >>= 16
		}
	}
	d.mu.Unlock()
	y := tensor.New(x.Shape...)
	tensor.Mul(y.Data, x.Data, mask)
	return y, dropoutState{mask: mask}
}

// Backward applies the same mask to dy.
func (d *Dropout) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	mask := s.(dropoutState).mask
	if mask == nil {
		return dy
	}
	dx := tensor.New(dy.Shape...)
	tensor.Mul(dx.Data, dy.Data, mask)
	return dx
}

// Params returns nil.
func (d *Dropout) Params() []*Param { return nil }

// Cost assumes training: a mask is drawn and held.
func (d *Dropout) Cost(in []int) Cost {
	n := numel(in)
	if d.P == 0 {
		return Cost{OutShape: slices.Clone(in)}
	}
	return Cost{ForwardFLOPs: 2 * float64(n), BackwardFLOPs: float64(n), ActivationBytes: int64(n) * f32, OutShape: slices.Clone(in)}
}
