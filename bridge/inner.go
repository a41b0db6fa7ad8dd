package bridge

import (
	"fmt"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
)

// remoteInner is the optimizer the averaging optimizer wraps for a client:
// its parameters and gradients are views of the shared region, and its
// Step asks the client to step its own optimizer (call) on them. A failed
// call is kept in err, which the session checks after the averaging
// optimizer's Step returns (optim.Optimizer's Step returns nothing).
type remoteInner struct {
	params []*nn.Param
	// state are the client optimizer's buffers, by name, over the region.
	state map[string]*tensor.Tensor
	lr    float64
	steps int64
	call  func() error
	err   error
}

// newRemoteInner returns the optimizer over the region's tensors: the
// parameters in the order of specs from element 0, their gradients after
// all of them (total elements each), then the state buffers in the order
// of state.
func newRemoteInner(r *region, specs []ParamSpec, total int, state []ParamSpec, call func() error) *remoteInner {
	ps := make([]*nn.Param, len(specs))
	off := 0
	for i, s := range specs {
		n, shape := size(s.Shape)
		ps[i] = &nn.Param{
			Name:  s.Name,
			Value: tensor.FromSlice(r.floats(off, n), shape...),
			Grad:  tensor.FromSlice(r.floats(total+off, n), shape...),
		}
		off += n
	}
	st := make(map[string]*tensor.Tensor, len(state))
	off = 2 * total
	for _, s := range state {
		n, shape := size(s.Shape)
		st[s.Name] = tensor.FromSlice(r.floats(off, n), shape...)
		off += n
	}
	return &remoteInner{params: ps, state: st, call: call}
}

// size is the number of elements of shape, and the shape a tensor takes
// ([1] for a scalar).
func size(shape []int) (int, []int) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	if len(shape) == 0 {
		return 1, []int{1}
	}
	return n, shape
}

// Step asks the client to take its optimizer's step, unless a call failed
// already.
func (o *remoteInner) Step() {
	if o.err != nil {
		return
	}
	if o.err = o.call(); o.err == nil {
		o.steps++
	}
}

// takeErr returns the failure of a call since the last takeErr, and
// clears it.
func (o *remoteInner) takeErr() error {
	err := o.err
	o.err = nil
	return err
}

// ZeroGrad clears the gradients in the region.
func (o *remoteInner) ZeroGrad() {
	for _, p := range o.params {
		clear(p.Grad.Data)
	}
}

// LR is the learning rate last set; the client's optimizer owns the real
// one.
func (o *remoteInner) LR() float64 { return o.lr }

// SetLR records lr; the client's optimizer owns the real one.
func (o *remoteInner) SetLR(lr float64) { o.lr = lr }

// Params returns the parameters over the region.
func (o *remoteInner) Params() []*nn.Param { return o.params }

// State is a copy of the step counter and the client optimizer's buffers
// as the client last wrote them (at its last inner step).
func (o *remoteInner) State() optim.State {
	st := optim.State{Step: o.steps, Tensors: make(map[string]*tensor.Tensor, len(o.state))}
	for name, t := range o.state {
		st.Tensors[name] = t.Clone()
	}
	return st
}

// LoadState writes a state's buffers into the region, for the client to
// read; it refuses one whose buffers differ in name or shape and leaves
// the region unchanged then.
func (o *remoteInner) LoadState(s optim.State) error {
	if len(s.Tensors) != len(o.state) {
		return fmt.Errorf("bridge: a state of %d optimizer buffers, the client's optimizer has %d", len(s.Tensors), len(o.state))
	}
	for name, t := range o.state {
		u, ok := s.Tensors[name]
		if !ok || !tensor.SameShape(t.Shape, u.Shape) {
			return fmt.Errorf("bridge: the state lacks optimizer buffer %s %v, or its shape differs", name, t.Shape)
		}
	}
	for name, t := range o.state {
		copy(t.Data, s.Tensors[name].Data)
	}
	o.steps = s.Step
	return nil
}
