package nn

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/skyhive/skyhive/tensor"
)

// newParam returns a parameter with a zero gradient of the value's shape.
func newParam(name string, v *tensor.Tensor) *Param {
	return &Param{Name: name, Value: v, Grad: tensor.New(v.Shape...)}
}

// fillNormal fills x with N(0, std²) samples from rng.
func fillNormal(x []float32, rng *rand.Rand, std float64) {
	tensor.FillNormal(x, rng, 0, float32(std))
}

// prefixed returns copies of ps whose names start with prefix + "."; the
// copies share Value and Grad with the originals.
func prefixed(prefix string, ps []*Param) []*Param {
	out := make([]*Param, len(ps))
	for i, p := range ps {
		out[i] = &Param{Name: prefix + "." + p.Name, Value: p.Value, Grad: p.Grad}
	}
	return out
}

// ZeroGrad sets every gradient in ps to zero.
func ZeroGrad(ps []*Param) {
	for _, p := range ps {
		p.Grad.Zero()
	}
}

// NumParams returns the number of trainable scalars in ps.
func NumParams(ps []*Param) int64 {
	var n int64
	for _, p := range ps {
		n += int64(p.Value.Len())
	}
	return n
}

// ExportParams returns deep copies of the parameter values keyed by name, for
// checkpoints and for shipping layer weights to another process.
func ExportParams(ps []*Param) map[string]*tensor.Tensor {
	out := make(map[string]*tensor.Tensor, len(ps))
	for _, p := range ps {
		out[p.Name] = p.Value.Clone()
	}
	return out
}

// ImportParams copies values from src into ps by name. The sets of names must
// match exactly and every shape must agree; on error nothing is modified.
// To load a subset of a larger checkpoint (e.g. one pipeline stage), filter
// the map with the stage's parameter names first.
func ImportParams(ps []*Param, src map[string]*tensor.Tensor) error {
	seen := make(map[string]bool, len(ps))
	for _, p := range ps {
		if seen[p.Name] {
			return fmt.Errorf("nn: import: duplicate parameter name %q", p.Name)
		}
		seen[p.Name] = true
		t, ok := src[p.Name]
		if !ok {
			return fmt.Errorf("nn: import: missing parameter %q", p.Name)
		}
		if !tensor.SameShape(t.Shape, p.Value.Shape) {
			return fmt.Errorf("nn: import: parameter %q has shape %v, want %v", p.Name, t.Shape, p.Value.Shape)
		}
		if len(t.Data) != len(p.Value.Data) {
			return fmt.Errorf("nn: import: parameter %q has %d values, want %d", p.Name, len(t.Data), len(p.Value.Data))
		}
	}
	if len(src) != len(ps) {
		var extra []string
		for name := range src {
			if !seen[name] {
				extra = append(extra, name)
			}
		}
		slices.Sort(extra)
		return fmt.Errorf("nn: import: unknown parameters %s", strings.Join(extra, ", "))
	}
	for _, p := range ps {
		copy(p.Value.Data, src[p.Name].Data)
	}
	return nil
}

// FilterParams returns the entries of src whose names appear in ps, e.g. to
// load one pipeline stage from a whole-model checkpoint.
func FilterParams(ps []*Param, src map[string]*tensor.Tensor) map[string]*tensor.Tensor {
	out := make(map[string]*tensor.Tensor, len(ps))
	for _, p := range ps {
		if t, ok := src[p.Name]; ok {
			out[p.Name] = t
		}
	}
	return out
}

// FlatValues copies the parameters' values, in order, into dst (which
// must hold at least their total length).
func FlatValues(ps []*Param, dst []float32) {
	o := 0
	for _, p := range ps {
		o += copy(dst[o:], p.Value.Data)
	}
}

// SetFlatValues copies src, in order, into the parameters' values.
func SetFlatValues(ps []*Param, src []float32) {
	o := 0
	for _, p := range ps {
		o += copy(p.Value.Data, src[o:])
	}
}

// FlatGrads copies the parameters' gradients, in order, into dst.
func FlatGrads(ps []*Param, dst []float32) {
	o := 0
	for _, p := range ps {
		o += copy(dst[o:], p.Grad.Data)
	}
}

// SetFlatGrads copies src, in order, into the parameters' gradients.
func SetFlatGrads(ps []*Param, src []float32) {
	o := 0
	for _, p := range ps {
		o += copy(p.Grad.Data, src[o:])
	}
}
