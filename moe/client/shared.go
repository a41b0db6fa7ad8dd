package client

import (
	"sync"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
)

// Shared holds the trainer-side parameters (input layer, gates, classifier)
// that several asynchronous trainers of one process share, the way expert
// servers share an expert among trainers: each trainer runs StepDeferred
// on its own replica of the Model and hands the result to Apply, which
// adds the gate gradients, recomputes the local layers' gradients with the
// master's current weights, takes an optimizer step and refreshes the
// replica. It is safe for concurrent use.
//
// With rounds (NewSharedRound), Apply only accumulates the gradients of a
// step, and every round-th call steps the optimizer once on their mean:
// with many trainers in flight a gradient is then fewer optimizer steps
// stale, and each step averages more samples.
type Shared struct {
	mu      sync.Mutex
	master  *Model
	params  []*nn.Param
	opt     optim.Optimizer
	round   int
	pending int
	steps   int64
}

// NewShared wraps master, whose parameters opt (built over master.Params())
// updates, with one optimizer step per Apply.
func NewShared(master *Model, opt optim.Optimizer) *Shared {
	return NewSharedRound(master, opt, 1)
}

// NewSharedRound is NewShared with one optimizer step per round of Apply
// calls (at least 1), on the mean of their gradients.
func NewSharedRound(master *Model, opt optim.Optimizer, round int) *Shared {
	s := &Shared{master: master, params: master.Params(), opt: opt, round: max(round, 1)}
	nn.ZeroGrad(s.params)
	return s
}

// Apply takes the replica's gate gradients and d, steps the optimizer if
// a round is complete, and copies the master's weights into the replica.
func (s *Shared) Apply(replica *Model, d Deferred) {
	rp := replica.Params()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range s.params {
		tensor.Axpy(1, rp[i].Grad.Data, p.Grad.Data)
	}
	s.master.ApplyDeferred(d)
	if s.pending++; s.pending >= s.round {
		if s.pending > 1 {
			for _, p := range s.params {
				tensor.Scale(1/float32(s.pending), p.Grad.Data)
			}
		}
		s.opt.Step()
		nn.ZeroGrad(s.params)
		s.pending = 0
		s.steps++
	}
	s.copyTo(rp)
}

// Sync copies the master's weights into the replica.
func (s *Shared) Sync(replica *Model) {
	rp := replica.Params()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.copyTo(rp)
}

// SetLR sets the optimizer's learning rate, e.g. from a schedule.
func (s *Shared) SetLR(lr float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opt.SetLR(lr)
}

// Steps returns the number of optimizer steps taken.
func (s *Shared) Steps() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.steps
}

// Export returns a copy of the master's parameters, for checkpoints.
func (s *Shared) Export() map[string]*tensor.Tensor {
	s.mu.Lock()
	defer s.mu.Unlock()
	return nn.ExportParams(s.params)
}

func (s *Shared) copyTo(rp []*nn.Param) {
	for i, p := range s.params {
		copy(rp[i].Value.Data, p.Value.Data)
	}
}
