package optim

import (
	"github.com/skyhive/skyhive/nn"
)

// SGDConfig configures SGD.
type SGDConfig struct {
	LR          float64
	Momentum    float64 // 0 disables the velocity buffer's effect
	WeightDecay float64 // L2 penalty added to the gradient (coupled)
	Nesterov    bool
}

// SGD is stochastic gradient descent with optional momentum, Nesterov
// momentum and L2 weight decay, following PyTorch's formulation:
//
//	g = grad + wd·w
//	v = μ·v + g            (v = g on the first step)
//	w −= lr·(g + μ·v)      if Nesterov, else w −= lr·v
//
// Its state holds one buffer per parameter, "<name>.momentum".
type SGD struct {
	cfg SGDConfig
	buffers
}

// NewSGD returns an SGD optimizer over params.
func NewSGD(params []*nn.Param, cfg SGDConfig) *SGD {
	return &SGD{cfg: cfg, buffers: newBuffers("sgd", params, cfg.LR, "momentum")}
}

// Step applies one update.
func (o *SGD) Step() {
	lr, mu, wd := float32(o.lr), float32(o.cfg.Momentum), float32(o.cfg.WeightDecay)
	for i, p := range o.params {
		w, g, v := p.Value.Data, p.Grad.Data, o.bufs[0][i].Data
		for j := range w {
			gj := g[j] + wd*w[j]
			if mu != 0 {
				if o.step == 0 {
					v[j] = gj
				} else {
					v[j] = mu*v[j] + gj
				}
				if o.cfg.Nesterov {
					gj += mu * v[j]
				} else {
					gj = v[j]
				}
			}
			w[j] -= lr * gj
		}
	}
	o.step++
}

var _ Optimizer = (*SGD)(nil)
