package data

import (
	"fmt"
	"iter"
	"math/rand/v2"

	"github.com/skyhive/skyhive/tensor"
)

// Dataset is a labelled set of examples. X holds the examples along its
// first dimension (shape [N, ...]) and Y the N integer labels.
type Dataset struct {
	X *tensor.Tensor
	Y []int
}

// NewDataset checks that x and y agree in length and returns them as a
// Dataset (sharing their memory).
func NewDataset(x *tensor.Tensor, y []int) (*Dataset, error) {
	if x == nil || len(x.Shape) == 0 {
		return nil, fmt.Errorf("data: examples need a tensor of rank >= 1")
	}
	for _, d := range x.Shape {
		if d < 0 {
			return nil, fmt.Errorf("data: negative dimension in shape %v", x.Shape)
		}
	}
	if tensor.NumElements(x.Shape) != len(x.Data) {
		return nil, fmt.Errorf("data: tensor shape %v does not hold %d elements", x.Shape, len(x.Data))
	}
	if x.Shape[0] != len(y) {
		return nil, fmt.Errorf("data: %d examples but %d labels", x.Shape[0], len(y))
	}
	return &Dataset{X: x, Y: y}, nil
}

// Len returns the number of examples.
func (d *Dataset) Len() int { return len(d.Y) }

// exampleSize is the number of float32 values per example.
func (d *Dataset) exampleSize() int {
	if len(d.Y) == 0 {
		return tensor.NumElements(d.X.Shape[1:])
	}
	return len(d.X.Data) / len(d.Y)
}

// shapeWith returns X's shape with the first dimension replaced by n.
func (d *Dataset) shapeWith(n int) []int {
	s := append([]int(nil), d.X.Shape...)
	s[0] = n
	return s
}

// Slice returns examples [lo, hi) as a Dataset that shares d's memory.
// It panics if the range is invalid, like slicing does.
func (d *Dataset) Slice(lo, hi int) *Dataset {
	if lo < 0 || hi < lo || hi > d.Len() {
		panic(fmt.Sprintf("data: slice [%d:%d] out of range for %d examples", lo, hi, d.Len()))
	}
	k := d.exampleSize()
	return &Dataset{
		X: &tensor.Tensor{Shape: d.shapeWith(hi - lo), Data: d.X.Data[lo*k : hi*k : hi*k]},
		Y: d.Y[lo:hi:hi],
	}
}

// Subset returns a copy of the examples at the given indices, in that order.
// It panics if an index is out of range.
func (d *Dataset) Subset(idx []int) *Dataset {
	b := d.Gather(idx)
	return &Dataset{X: b.X, Y: b.Y}
}

// Gather copies the examples at idx into a new Batch. It panics if an index
// is out of range.
func (d *Dataset) Gather(idx []int) Batch {
	k := d.exampleSize()
	x := make([]float32, len(idx)*k)
	y := make([]int, len(idx))
	for j, i := range idx {
		if i < 0 || i >= d.Len() {
			panic(fmt.Sprintf("data: index %d out of range for %d examples", i, d.Len()))
		}
		copy(x[j*k:(j+1)*k], d.X.Data[i*k:(i+1)*k])
		y[j] = d.Y[i]
	}
	return Batch{
		X:     &tensor.Tensor{Shape: d.shapeWith(len(idx)), Data: x},
		Y:     y,
		Index: append([]int(nil), idx...),
	}
}

// Shard returns peer i's share of d when n data-parallel peers split it:
// the contiguous block [i*N/n, (i+1)*N/n). The n shards are disjoint, cover
// every example, and differ in size by at most one. The shard shares d's
// memory. Blocks are contiguous, so shuffle an ordered dataset (Split with
// n = 0 returns a shuffled copy) before sharding it.
func (d *Dataset) Shard(i, n int) (*Dataset, error) {
	if n < 1 || i < 0 || i >= n {
		return nil, fmt.Errorf("data: shard %d of %d: need 0 <= i < n", i, n)
	}
	lo, hi := shardBound(d.Len(), i, n), shardBound(d.Len(), i+1, n)
	return d.Slice(lo, hi), nil
}

// shardBound returns floor(total*i/n) without overflowing.
func shardBound(total, i, n int) int {
	q, r := total/n, total%n
	return q*i + r*i/n
}

// Split shuffles the example indices with the given seed and returns a copy
// of the first n examples and a copy of the remaining Len()-n, e.g. a
// validation set and a training set.
func (d *Dataset) Split(n int, seed uint64) (first, rest *Dataset, err error) {
	if n < 0 || n > d.Len() {
		return nil, nil, fmt.Errorf("data: cannot split %d examples off a dataset of %d", n, d.Len())
	}
	perm := rand.New(rand.NewPCG(seed, 0)).Perm(d.Len())
	return d.Subset(perm[:n]), d.Subset(perm[n:]), nil
}

// Batch is a mini-batch: X has shape [B, ...], Y holds the B labels and
// Index the positions of the examples in the source Dataset.
type Batch struct {
	X     *tensor.Tensor
	Y     []int
	Index []int
}

// Len returns the number of examples in the batch.
func (b Batch) Len() int { return len(b.Y) }

// BatchOptions configures a Loader.
type BatchOptions struct {
	// Size is the number of examples per batch; it must be positive.
	Size int
	// Shuffle permutes the examples anew every epoch. The permutation of
	// epoch e depends only on (Seed, e), so runs are reproducible and
	// peers that share a seed agree on the order.
	Shuffle bool
	// Seed seeds the per-epoch shuffles.
	Seed uint64
	// DropLast skips a final batch smaller than Size.
	DropLast bool
}

// Loader cuts a Dataset into mini-batches, epoch after epoch.
type Loader struct {
	d   *Dataset
	opt BatchOptions
}

// NewLoader returns a Loader over d.
func NewLoader(d *Dataset, opt BatchOptions) (*Loader, error) {
	if d == nil {
		return nil, fmt.Errorf("data: loader needs a dataset")
	}
	if opt.Size < 1 {
		return nil, fmt.Errorf("data: batch size %d must be positive", opt.Size)
	}
	return &Loader{d: d, opt: opt}, nil
}

// Len returns the number of batches per epoch.
func (l *Loader) Len() int {
	n := l.d.Len()
	if l.opt.DropLast {
		return n / l.opt.Size
	}
	return (n + l.opt.Size - 1) / l.opt.Size
}

// Order returns the order in which epoch visits the examples: the identity
// without shuffling, otherwise a permutation seeded by (Seed, epoch).
func (l *Loader) Order(epoch int) []int {
	n := l.d.Len()
	if !l.opt.Shuffle {
		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		return order
	}
	return rand.New(rand.NewPCG(l.opt.Seed, uint64(epoch))).Perm(n)
}

// Epoch yields the batches of one epoch with their index within the epoch.
// Each Batch owns freshly allocated memory, so callers may keep it.
func (l *Loader) Epoch(epoch int) iter.Seq2[int, Batch] {
	return func(yield func(int, Batch) bool) {
		order := l.Order(epoch)
		for b := range l.Len() {
			lo := b * l.opt.Size
			hi := min(lo+l.opt.Size, len(order))
			if !yield(b, l.d.Gather(order[lo:hi])) {
				return
			}
		}
	}
}
