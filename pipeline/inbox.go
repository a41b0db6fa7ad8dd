package pipeline

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/skyhive/skyhive/tensor"
)

// actKey identifies one tensor a stage waits for.
type actKey struct {
	iter, micro int
	backward    bool
}

// maxInbox bounds the tensors a stage holds for iterations it has not
// consumed yet.
const maxInbox = 4 * maxMicro

// inbox holds activations and gradients that arrived from neighbours until
// the schedule consumes them. It accepts only the current and the next
// iteration, each key once, and per-example shapes that match the stage.
type inbox struct {
	in, out []int // per-example shapes of forward inputs and backward gradients

	mu      sync.Mutex
	minIter int // oldest iteration still accepted
	slots   map[actKey]*slot
}

type slot struct {
	ch     chan *tensor.Tensor // capacity 1
	filled bool
}

func newInbox(iter int, in, out []int) *inbox {
	return &inbox{in: in, out: out, minIter: iter, slots: map[actKey]*slot{}}
}

func (b *inbox) slot(k actKey) *slot {
	s := b.slots[k]
	if s == nil {
		s = &slot{ch: make(chan *tensor.Tensor, 1)}
		b.slots[k] = s
	}
	return s
}

// put stores t under k.
func (b *inbox) put(k actKey, t *tensor.Tensor) error {
	want := b.in
	if k.backward {
		want = b.out
	}
	if want == nil {
		return fmt.Errorf("pipeline: no stage to receive activations")
	}
	if len(t.Shape) != len(want)+1 || t.Shape[0] < 1 || t.Shape[0] > maxBatch || !slices.Equal(t.Shape[1:], want) {
		return fmt.Errorf("pipeline: activation of shape %v, want [n %v]", t.Shape, want)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case k.iter < b.minIter || k.iter > b.minIter+1:
		return fmt.Errorf("pipeline: activation of iteration %d, accepting %d..%d", k.iter, b.minIter, b.minIter+1)
	case k.micro < 0 || k.micro >= maxMicro:
		return fmt.Errorf("pipeline: micro-batch %d out of range", k.micro)
	case len(b.slots) >= maxInbox && b.slots[k] == nil:
		return fmt.Errorf("pipeline: inbox full")
	}
	s := b.slot(k)
	if s.filled {
		return fmt.Errorf("pipeline: duplicate activation %+v", k)
	}
	s.filled = true
	s.ch <- t
	return nil
}

// get waits for the tensor under k.
func (b *inbox) get(ctx context.Context, k actKey) (*tensor.Tensor, error) {
	b.mu.Lock()
	s := b.slot(k)
	b.mu.Unlock()
	select {
	case t := <-s.ch:
		return t, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// done drops everything of iterations up to iter and accepts iter+1 and
// iter+2 from now on.
func (b *inbox) done(iter int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.minIter = max(b.minIter, iter+1)
	for k := range b.slots {
		if k.iter <= iter {
			delete(b.slots, k)
		}
	}
}
