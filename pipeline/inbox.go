package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
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
// iteration, each key once, per-example shapes that match the stage,
// finite values only, and at most rows examples (a batch) per iteration
// and direction, so what it holds is bounded by four batches of the
// stage's activations whatever the neighbours send.
type inbox struct {
	in, out []int // per-example shapes of forward inputs and backward gradients
	// rows bounds the examples of one iteration and direction (the
	// batch, split into micro-batches); set before the inbox is shared.
	rows int

	mu      sync.Mutex
	minIter int // oldest iteration still accepted
	slots   map[actKey]*slot
	held    map[actKey]int // examples accepted per iteration and direction (micro 0)
}

type slot struct {
	ch     chan *tensor.Tensor // capacity 1
	filled bool
}

func newInbox(iter int, in, out []int) *inbox {
	return &inbox{in: in, out: out, rows: maxBatch, minIter: iter, slots: map[actKey]*slot{}, held: map[actKey]int{}}
}

// actHeaderBytes bounds the JSON header of one activation message (an
// honest one takes about 60 bytes).
const actHeaderBytes = 1 << 10

// shape returns the per-example shape of the tensors a direction carries,
// nil when the inbox has no stage.
func (b *inbox) shape(backward bool) []int {
	if backward {
		return b.out
	}
	return b.in
}

// elems is the number of values of one example of shape, or −1 if the
// shape is missing or absurd.
func elems(shape []int) int {
	if shape == nil {
		return -1
	}
	n := 1
	for _, d := range shape {
		if d < 1 || n > math.MaxInt32/d {
			return -1
		}
		n *= d
	}
	return n
}

// limits are the decoder's limits of one tensor of a direction.
func (b *inbox) limits(backward bool) wire.Limits {
	shape := b.shape(backward)
	return wire.Limits{MaxElements: max(b.rows*max(elems(shape), 1), 1), MaxDims: len(shape) + 1, MaxTensors: 1}
}

// frameBytes is the most bytes one encoded activation message of a
// direction may take (header, wire framing and a full micro-batch of
// float32 values), or 0 when the inbox accepts none of that direction.
func (b *inbox) frameBytes(backward bool) int64 {
	shape := b.shape(backward)
	n := elems(shape)
	if n < 0 {
		return 0
	}
	const wireOverhead = 64 // message and tensor headers, the name "t"
	return 4 + actHeaderBytes + wireOverhead + 4*int64(len(shape)+1) + 4*int64(b.rows)*int64(n)
}

func (b *inbox) slot(k actKey) *slot {
	s := b.slots[k]
	if s == nil {
		s = &slot{ch: make(chan *tensor.Tensor, 1)}
		b.slots[k] = s
	}
	return s
}

// errBadAct marks a tensor whose content a stage refuses (shape, values):
// the sender computed or sent something wrong.
var errBadAct = errors.New("pipeline: bad activation")

// put stores t under k.
func (b *inbox) put(k actKey, t *tensor.Tensor) error {
	want := b.in
	if k.backward {
		want = b.out
	}
	if want == nil {
		return fmt.Errorf("pipeline: no stage to receive activations")
	}
	if len(t.Shape) != len(want)+1 || t.Shape[0] < 1 || t.Shape[0] > b.rows || !slices.Equal(t.Shape[1:], want) {
		return fmt.Errorf("%w: activation of shape %v, want [n %v] with n ≤ %d", errBadAct, t.Shape, want, b.rows)
	}
	for _, v := range t.Data {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%w: activation holds %v", errBadAct, v)
		}
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
	dir := actKey{iter: k.iter, backward: k.backward}
	if b.held[dir]+t.Shape[0] > b.rows {
		return fmt.Errorf("%w: %d more examples in iteration %d, over the batch of %d", errBadAct, t.Shape[0], k.iter, b.rows)
	}
	b.held[dir] += t.Shape[0]
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
	for k := range b.held {
		if k.iter <= iter {
			delete(b.held, k)
		}
	}
}
