package optim

import (
	"math"

	"github.com/skyhive/skyhive/nn"
)

// AdamWConfig configures AdamW. Zero Beta1, Beta2 and Eps select the usual
// 0.9, 0.999 and 1e-8.
type AdamWConfig struct {
	LR           float64
	Beta1, Beta2 float64
	Eps          float64
	WeightDecay  float64
	// NoDecay, if set, exempts parameters for which it returns true from
	// weight decay; NoDecayVectors exempts biases and LayerNorm parameters.
	NoDecay func(p *nn.Param) bool
}

// NoDecayVectors reports whether p is one-dimensional (a bias or a
// LayerNorm gain), the parameters BERT trains without weight decay.
func NoDecayVectors(p *nn.Param) bool { return len(p.Value.Shape) <= 1 }

// AdamW is Adam with decoupled weight decay (Loshchilov & Hutter) and bias
// correction. At step t (from 1):
//
//	w −= lr·wd·w
//	m = β1·m + (1−β1)·g,  v = β2·v + (1−β2)·g²
//	w −= lr · (m/(1−β1ᵗ)) / (sqrt(v/(1−β2ᵗ)) + eps)
//
// Its state holds "<name>.m" and "<name>.v" per parameter.
type AdamW struct {
	cfg   AdamWConfig
	decay []bool
	buffers
}

// NewAdamW returns an AdamW optimizer over params.
func NewAdamW(params []*nn.Param, cfg AdamWConfig) *AdamW {
	if cfg.Beta1 == 0 {
		cfg.Beta1 = 0.9
	}
	if cfg.Beta2 == 0 {
		cfg.Beta2 = 0.999
	}
	if cfg.Eps == 0 {
		cfg.Eps = 1e-8
	}
	o := &AdamW{cfg: cfg, buffers: newBuffers("adamw", params, cfg.LR, "m", "v")}
	o.decay = make([]bool, len(params))
	for i, p := range params {
		o.decay[i] = cfg.NoDecay == nil || !cfg.NoDecay(p)
	}
	return o
}

// Step applies one update.
func (o *AdamW) Step() {
	t := float64(o.step + 1)
	b1, b2 := float32(o.cfg.Beta1), float32(o.cfg.Beta2)
	c1 := 1 - math.Pow(o.cfg.Beta1, t)
	c2 := 1 - math.Pow(o.cfg.Beta2, t)
	// w −= lr/c1 · m / (sqrt(v)/sqrt(c2) + eps)
	stepSize := float32(o.lr / c1)
	rc2 := float32(1 / math.Sqrt(c2))
	eps := float32(o.cfg.Eps)
	for i, p := range o.params {
		w, g := p.Value.Data, p.Grad.Data
		m, v := o.bufs[0][i].Data, o.bufs[1][i].Data
		if o.decay[i] && o.cfg.WeightDecay != 0 {
			k := float32(1 - o.lr*o.cfg.WeightDecay)
			for j := range w {
				w[j] *= k
			}
		}
		for j, gj := range g {
			mj := b1*m[j] + (1-b1)*gj
			vj := b2*v[j] + (1-b2)*gj*gj
			m[j], v[j] = mj, vj
			w[j] -= stepSize * mj / (float32(math.Sqrt(float64(vj)))*rc2 + eps)
		}
	}
	o.step++
}

var _ Optimizer = (*AdamW)(nil)
