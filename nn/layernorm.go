package nn

import (
	"math"
	"slices"

	"github.com/skyhive/skyhive/tensor"
)

// LayerNorm normalises the last dimension of its input to zero mean and unit
// variance, then applies a learned scale gamma ("gamma", init 1) and shift
// beta ("beta", init 0): y = (x − mean)/sqrt(var + Eps)·gamma + beta, with the
// biased variance as in BERT and PyTorch.
type LayerNorm struct {
	Dim         int
	Eps         float32
	Gamma, Beta *Param
}

// NewLayerNorm returns a LayerNorm over a last dimension of size dim.
func NewLayerNorm(dim int, eps float32) *LayerNorm {
	g := tensor.New(dim)
	for i := range g.Data {
		g.Data[i] = 1
	}
	return &LayerNorm{Dim: dim, Eps: eps, Gamma: newParam("gamma", g), Beta: newParam("beta", tensor.New(dim))}
}

type layerNormState struct {
	xhat *tensor.Tensor // normalised input
	rstd []float32      // 1/sqrt(var+eps) per row
}

// Forward normalises every row of the last dimension.
func (l *LayerNorm) Forward(_ Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	checkLast("LayerNorm", x.Shape, l.Dim)
	rows, d := rowsOf(x.Shape)
	xhat := tensor.New(x.Shape...)
	y := tensor.New(x.Shape...)
	rstd := make([]float32, rows)
	g, b := l.Gamma.Value.Data, l.Beta.Value.Data
	mean := make([]float32, rows)
	tensor.MeanVarRows(mean, rstd, x.Data, rows, d)
	parallelFor(rows, rowGrain(d), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			rs := float32(1 / math.Sqrt(float64(rstd[r]+l.Eps)))
			rstd[r] = rs
			mu := mean[r]
			xr := x.Data[r*d : (r+1)*d]
			hr := xhat.Data[r*d : (r+1)*d]
			yr := y.Data[r*d : (r+1)*d]
			for j, v := range xr {
				h := (v - mu) * rs
				hr[j] = h
				yr[j] = h*g[j] + b[j]
			}
		}
	})
	return y, layerNormState{xhat: xhat, rstd: rstd}
}

// Backward accumulates dgamma, dbeta and returns dx.
func (l *LayerNorm) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	st := s.(layerNormState)
	rows, d := rowsOf(dy.Shape)
	dx := tensor.New(dy.Shape...)
	g := l.Gamma.Value.Data
	dg, db := l.Gamma.Grad.Data, l.Beta.Grad.Data
	inv := 1 / float32(d)
	parallelFor(rows, rowGrain(d), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			hr := st.xhat.Data[r*d : (r+1)*d]
			dyr := dy.Data[r*d : (r+1)*d]
			dxr := dx.Data[r*d : (r+1)*d]
			var sum, sumH float32
			for j, v := range dyr {
				gh := v * g[j] // dxhat
				sum += gh
				sumH += gh * hr[j]
			}
			sum *= inv
			sumH *= inv
			rs := st.rstd[r]
			for j, v := range dyr {
				dxr[j] = rs * (v*g[j] - sum - hr[j]*sumH)
			}
		}
	})
	for r := 0; r < rows; r++ {
		hr := st.xhat.Data[r*d : (r+1)*d]
		dyr := dy.Data[r*d : (r+1)*d]
		for j, v := range dyr {
			dg[j] += v * hr[j]
		}
	}
	accColSums(db, dy.Data, rows, d)
	return dx
}

// Params returns gamma and beta.
func (l *LayerNorm) Params() []*Param { return []*Param{l.Gamma, l.Beta} }

// Cost counts about 8 FLOPs per element forward and 10 backward; the
// normalised input is held.
func (l *LayerNorm) Cost(in []int) Cost {
	checkLast("LayerNorm", in, l.Dim)
	n := numel(in)
	rows, _ := rowsOf(in)
	return Cost{
		ForwardFLOPs:    8 * float64(n),
		BackwardFLOPs:   10 * float64(n),
		Params:          int64(2 * l.Dim),
		ActivationBytes: int64(n+rows) * f32,
		OutShape:        slices.Clone(in),
	}
}
