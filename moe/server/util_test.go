package server

import (
	"math"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
)

func importInto(m nn.Module, w map[string]*tensor.Tensor) error {
	return nn.ImportParams(m.Params(), w)
}

func forwardLocal(m nn.Module, x *tensor.Tensor) *tensor.Tensor {
	y, _ := m.Forward(nn.Ctx{}, x)
	return y
}

func maxDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}
