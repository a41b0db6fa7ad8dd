// Package optim updates the parameters of an nn model from their gradients:
// SGD with momentum, AdamW, global gradient-norm clipping and learning-rate
// schedules.
//
// Optimizer state is keyed by parameter name and can be exported as named
// tensors plus a step counter, so checkpoints and pipeline re-planning can
// move it between processes along with the weights.
package optim

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
)

// Optimizer updates a fixed list of parameters from their gradients.
type Optimizer interface {
	// Step applies one update using the current gradients and learning
	// rate, then advances the step counter.
	Step()
	// ZeroGrad clears the gradients of the optimizer's parameters.
	ZeroGrad()
	// LR returns the learning rate used by the next Step.
	LR() float64
	// SetLR sets the learning rate, e.g. from a Schedule before each Step.
	SetLR(lr float64)
	// Params returns the parameters being optimized.
	Params() []*nn.Param
	// State returns a deep copy of the optimizer state.
	State() State
	// LoadState replaces the optimizer state; it validates names and shapes
	// and leaves the state unchanged on error.
	LoadState(s State) error
}

// State is an optimizer's state: its step counter and named buffers
// "<param name>.<buffer>" (e.g. "3.enc.attn.wq.weight.m").
type State struct {
	Step    int64
	Tensors map[string]*tensor.Tensor
}

// Filter returns the part of s that belongs to the named parameters, e.g. to
// hand one pipeline stage its slice of a whole-model optimizer state.
func (s State) Filter(params []*nn.Param) State {
	out := State{Step: s.Step, Tensors: map[string]*tensor.Tensor{}}
	for _, p := range params {
		for name, t := range s.Tensors {
			if strings.HasPrefix(name, p.Name+".") && !strings.Contains(name[len(p.Name)+1:], ".") {
				out.Tensors[name] = t
			}
		}
	}
	return out
}

// Merge combines states of disjoint parameter sets (e.g. all pipeline
// stages) into one; the step counters must agree.
func Merge(states ...State) (State, error) {
	out := State{Tensors: map[string]*tensor.Tensor{}}
	for i, s := range states {
		if i > 0 && s.Step != out.Step {
			return State{}, fmt.Errorf("optim: merge: step %d differs from %d", s.Step, out.Step)
		}
		out.Step = s.Step
		for name, t := range s.Tensors {
			if _, dup := out.Tensors[name]; dup {
				return State{}, fmt.Errorf("optim: merge: %q appears twice", name)
			}
			out.Tensors[name] = t
		}
	}
	return out, nil
}

// buffers holds one set of per-parameter buffers of the same shape as the
// parameter, named by suffix.
type buffers struct {
	params  []*nn.Param
	suffix  []string
	bufs    [][]*tensor.Tensor // bufs[k][i] is buffer suffix[k] of params[i]
	lr      float64
	step    int64
	optName string
}

func newBuffers(name string, params []*nn.Param, lr float64, suffix ...string) buffers {
	b := buffers{params: slices.Clone(params), suffix: suffix, lr: lr, optName: name}
	b.bufs = make([][]*tensor.Tensor, len(suffix))
	for k := range suffix {
		b.bufs[k] = make([]*tensor.Tensor, len(params))
		for i, p := range params {
			b.bufs[k][i] = tensor.New(p.Value.Shape...)
		}
	}
	return b
}

// ZeroGrad clears the gradients.
func (b *buffers) ZeroGrad() { nn.ZeroGrad(b.params) }

// LR returns the learning rate.
func (b *buffers) LR() float64 { return b.lr }

// SetLR sets the learning rate.
func (b *buffers) SetLR(lr float64) { b.lr = lr }

// Params returns the parameters.
func (b *buffers) Params() []*nn.Param { return slices.Clone(b.params) }

// State returns a deep copy of the step counter and buffers.
func (b *buffers) State() State {
	s := State{Step: b.step, Tensors: make(map[string]*tensor.Tensor, len(b.params)*len(b.suffix))}
	for k, suf := range b.suffix {
		for i, p := range b.params {
			s.Tensors[p.Name+"."+suf] = b.bufs[k][i].Clone()
		}
	}
	return s
}

// LoadState copies s into the buffers after checking that it holds exactly
// the expected names and shapes.
func (b *buffers) LoadState(s State) error {
	if s.Step < 0 {
		return fmt.Errorf("optim: %s: negative step %d", b.optName, s.Step)
	}
	want := map[string]bool{}
	for k, suf := range b.suffix {
		for i, p := range b.params {
			name := p.Name + "." + suf
			want[name] = true
			t, ok := s.Tensors[name]
			if !ok {
				return fmt.Errorf("optim: %s: state lacks %q", b.optName, name)
			}
			if !tensor.SameShape(t.Shape, b.bufs[k][i].Shape) || len(t.Data) != len(b.bufs[k][i].Data) {
				return fmt.Errorf("optim: %s: state %q has shape %v, want %v", b.optName, name, t.Shape, b.bufs[k][i].Shape)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.Tensors)) {
		if !want[name] {
			return fmt.Errorf("optim: %s: unknown state tensor %q", b.optName, name)
		}
	}
	for k, suf := range b.suffix {
		for i, p := range b.params {
			copy(b.bufs[k][i].Data, s.Tensors[p.Name+"."+suf].Data)
		}
	}
	b.step = s.Step
	return nil
}

// ClipGradNorm scales all gradients of params by maxNorm/norm if their
// global L2 norm exceeds maxNorm, and returns the norm before clipping
// (accumulated in float64). A non-finite norm leaves the gradients
// untouched so the caller can skip the step.
func ClipGradNorm(params []*nn.Param, maxNorm float64) float64 {
	var ss float64
	for _, p := range params {
		ss += tensor.SumSquares(p.Grad.Data)
	}
	norm := math.Sqrt(ss)
	if norm > maxNorm && !math.IsInf(norm, 0) && !math.IsNaN(norm) {
		scale := float32(maxNorm / (norm + 1e-12))
		for _, p := range params {
			tensor.Scale(scale, p.Grad.Data)
		}
	}
	return norm
}
