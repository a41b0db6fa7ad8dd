package optimizer

import (
	"context"
	"fmt"
	"maps"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
)

// algorithm is a training algorithm the Optimizer drives. Each holds its
// own configuration and state and reaches the driver's common parts (the
// parameters, the wrapped optimizer, the averager, the fixed roster's
// rounds, the statistics, the lock) through the Optimizer it was made
// for. Its background work runs through Optimizer.goLocked, so Close
// stops and waits for it.
type algorithm interface {
	// step is Optimizer.Step once the optimizer runs: the wrapped
	// optimizer's step with the caller's gradients of samples examples
	// (Optimizer.innerStep), and the averaging around it. round is the
	// round counter before the step.
	step(ctx context.Context, samples, round int) error
	// buffers returns the algorithm's own state that a joiner downloads
	// beside the wrapped optimizer's, by name (views of its buffers, read
	// and written under Optimizer.mu), or nil. The names must not be ones
	// the wrapped optimizer uses.
	buffers() map[string]*tensor.Tensor
	// resumeLocked readies the algorithm after LoadState has written its
	// buffers and made round the round counter (Optimizer.mu held).
	resumeLocked(round int)
	// consensusLocked returns a copy of the model the swarm agrees on if
	// it is not the model itself (Optimizer.Consensus), or nil
	// (Optimizer.mu held).
	consensusLocked() []float32
	// startLocked starts the algorithm's background work, at the first
	// Step (Optimizer.mu held; ctx ends at Close).
	startLocked(ctx context.Context)
}

// grouper is an algorithm that averages in the butterfly groups of a fixed
// roster (WAGMA, WA-DiLoCo); ranks runs its group rounds.
type grouper interface {
	// busyLocked reports whether this peer declines group rounds now,
	// besides for lack of an in-flight slot (Optimizer.mu held).
	busyLocked() bool
	// groupWorkLocked takes this peer's part of a group round (a snapshot,
	// Optimizer.mu held) and returns the all-reduce that ranks runs in the
	// background with the group's session.
	groupWorkLocked() func(context.Context, averaging.Session)
	// joinGlobal starts the global round another peer announced itself and
	// reports true, or reports false for ranks to note the round for the
	// next Step.
	joinGlobal(round int) bool
}

// algorithmEntry names an algorithm and makes it for an Optimizer (whose
// Config it may complete, or refuse with an error wrapping ErrConfig).
type algorithmEntry struct {
	name Algo
	make func(*Optimizer) (algorithm, error)
}

// algorithms lists the algorithms by name, in the order ParseAlgo names
// them, with the constructor of each. A new algorithm is one line here.
func algorithms() []algorithmEntry {
	return []algorithmEntry{
		{WAGMA, newWAGMA},
		{AllReduce, newAllReduce},
		{Local, newLocalSGD},
		{DiLoCo, newDiLoCo},
		{WADiLoCo, newWADiLoCo},
	}
}

// newAlgorithm returns the algorithm o's configuration names (ParseAlgo
// has checked the name). Streaming DiLoCo's options are refused for the
// algorithms that do not take them.
func newAlgorithm(o *Optimizer) (algorithm, error) {
	for _, a := range algorithms() {
		if a.name != o.cfg.Algo {
			continue
		}
		alg, err := a.make(o)
		if err != nil {
			return nil, err
		}
		if _, err := newStream(o.cfg, o.n); err != nil {
			return nil, err
		}
		return alg, nil
	}
	return nil, fmt.Errorf("%w: no algorithm %q", ErrConfig, o.cfg.Algo)
}

// stateless gives an algorithm without state of its own, consensus model
// or background work the methods of algorithm that say so.
type stateless struct{}

func (stateless) buffers() map[string]*tensor.Tensor { return nil }
func (stateless) resumeLocked(int)                   {}
func (stateless) consensusLocked() []float32         { return nil }
func (stateless) startLocked(context.Context)        {}

// withBuffers returns st with an algorithm's buffers added (st itself when
// there are none).
func withBuffers(st optim.State, bufs map[string]*tensor.Tensor) optim.State {
	if len(bufs) == 0 {
		return st
	}
	out := optim.State{Step: st.Step, Tensors: maps.Clone(st.Tensors)}
	if out.Tensors == nil {
		out.Tensors = map[string]*tensor.Tensor{}
	}
	maps.Copy(out.Tensors, bufs)
	return out
}
