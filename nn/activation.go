package nn

import (
	"slices"

	"github.com/skyhive/skyhive/tensor"
)

// elemGrain is the smallest number of elements worth a goroutine in
// element-wise kernels.
const elemGrain = 1 << 15

// ReLU is max(x, 0) element-wise. It has no parameters.
type ReLU struct{}

type reluState struct{ y *tensor.Tensor }

// Forward returns max(x, 0).
func (ReLU) Forward(_ Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	y := tensor.New(x.Shape...)
	tensor.ReLU(y.Data, x.Data)
	return y, reluState{y: y}
}

// Backward passes dy where the output was positive.
func (ReLU) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	y := s.(reluState).y
	dx := tensor.New(dy.Shape...)
	tensor.ReLUBackward(dx.Data, y.Data, dy.Data)
	return dx
}

// Params returns nil.
func (ReLU) Params() []*Param { return nil }

// Cost counts one FLOP per element each way and holds the output.
func (ReLU) Cost(in []int) Cost {
	n := numel(in)
	return Cost{ForwardFLOPs: float64(n), BackwardFLOPs: float64(n), ActivationBytes: int64(n) * f32, OutShape: slices.Clone(in)}
}

// GELU is the Gaussian error linear unit with the tanh approximation used by
// BERT: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
type GELU struct{}

type geluState struct{ x *tensor.Tensor }

// Forward returns GELU(x).
func (GELU) Forward(_ Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	y := tensor.New(x.Shape...)
	parallelFor(len(x.Data), elemGrain, func(lo, hi int) { tensor.GELU(y.Data[lo:hi], x.Data[lo:hi]) })
	return y, geluState{x: x}
}

// Backward returns dy·GELU'(x).
func (GELU) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	x := s.(geluState).x
	dx := tensor.New(x.Shape...)
	parallelFor(len(x.Data), elemGrain, func(lo, hi int) {
		tensor.GELUBackward(dx.Data[lo:hi], x.Data[lo:hi], dy.Data[lo:hi])
	})
	return dx
}

// Params returns nil.
func (GELU) Params() []*Param { return nil }

// Cost counts about 10 FLOPs per element forward and 16 backward; the input
// is held.
func (GELU) Cost(in []int) Cost {
	n := numel(in)
	return Cost{ForwardFLOPs: 10 * float64(n), BackwardFLOPs: 16 * float64(n), ActivationBytes: int64(n) * f32, OutShape: slices.Clone(in)}
}
