package nn

import (
	"math"
	"math/rand/v2"

	"github.com/skyhive/skyhive/tensor"
)

// Linear is an affine map y = x·W + b on the last dimension of x; all leading
// dimensions are treated as batch, so [batch, seq, in] maps to
// [batch, seq, out].
//
// Layout: W is stored as [In, Out] row-major (the transpose of PyTorch's
// nn.Linear weight), so the forward pass is a plain GEMM without transposes.
// b has shape [Out]. Parameters are named "weight" and "bias".
type Linear struct {
	In, Out int
	W, B    *Param
}

// NewLinear returns a Linear layer with weights drawn from N(0, std²) and a
// zero bias. Use HeStd or XavierStd for std, or 0.02 for BERT.
func NewLinear(in, out int, std float64, rng *rand.Rand) *Linear {
	w := tensor.New(in, out)
	fillNormal(w.Data, rng, std)
	return &Linear{
		In:  in,
		Out: out,
		W:   newParam("weight", w),
		B:   newParam("bias", tensor.New(out)),
	}
}

// HeStd is the He (Kaiming) normal initialisation scale sqrt(2/fanIn), for
// layers followed by ReLU.
func HeStd(fanIn int) float64 { return math.Sqrt(2 / float64(fanIn)) }

// XavierStd is the Xavier (Glorot) normal initialisation scale
// sqrt(2/(fanIn+fanOut)).
func XavierStd(fanIn, fanOut int) float64 { return math.Sqrt(2 / float64(fanIn+fanOut)) }

type linearState struct{ x *tensor.Tensor }

// Forward computes x·W + b.
func (l *Linear) Forward(_ Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	checkLast("Linear", x.Shape, l.In)
	rows, _ := rowsOf(x.Shape)
	y := tensor.New(withLast(x.Shape, l.Out)...)
	for r := 0; r < rows; r++ {
		copy(y.Data[r*l.Out:(r+1)*l.Out], l.B.Value.Data)
	}
	tensor.Gemm(false, false, rows, l.Out, l.In, 1, x.Data, l.In, l.W.Value.Data, l.Out, 1, y.Data, l.Out)
	return y, linearState{x: x}
}

// Backward accumulates dW += xᵀ·dy and db += Σ dy and returns dy·Wᵀ.
func (l *Linear) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	x := s.(linearState).x
	rows, _ := rowsOf(x.Shape)
	tensor.Gemm(true, false, l.In, l.Out, rows, 1, x.Data, l.In, dy.Data, l.Out, 1, l.W.Grad.Data, l.Out)
	accColSums(l.B.Grad.Data, dy.Data, rows, l.Out)
	dx := tensor.New(x.Shape...)
	tensor.Gemm(false, true, rows, l.In, l.Out, 1, dy.Data, l.Out, l.W.Value.Data, l.Out, 0, dx.Data, l.In)
	return dx
}

// Params returns the weight and the bias.
func (l *Linear) Params() []*Param { return []*Param{l.W, l.B} }

// Cost counts one GEMM forward and two backward; the input is held.
func (l *Linear) Cost(in []int) Cost {
	checkLast("Linear", in, l.In)
	rows, _ := rowsOf(in)
	f := 2 * float64(rows) * float64(l.In) * float64(l.Out)
	return Cost{
		ForwardFLOPs:    f + float64(rows*l.Out),
		BackwardFLOPs:   2*f + float64(rows*l.Out),
		Params:          int64(l.In*l.Out + l.Out),
		ActivationBytes: int64(rows*l.In) * f32,
		OutShape:        withLast(in, l.Out),
	}
}
