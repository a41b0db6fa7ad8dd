package nn

import (
	"fmt"
	"strconv"

	"github.com/skyhive/skyhive/tensor"
)

// Layer is one named child of a Sequential.
type Layer struct {
	// Name describes the child ("embed", "enc", "head", …); it need not be
	// unique because parameter names also carry the child's index.
	Name   string
	Module Module
}

// Sequential runs its children one after the other. Parameter names are
// "<index>.<name>.<child param>" (or "<index>.<child param>" for an unnamed
// child), e.g. "3.enc.attn.wq.weight", where index is the child's position in
// the original, unsliced model. A slice therefore names its parameters
// exactly as the whole model does, so weights exported from the whole model
// can be shipped to the pipeline stage that holds a slice of it.
type Sequential struct {
	layers []Layer
	base   int // index of layers[0] in the original model
}

// NewSequential returns a Sequential of the given children.
func NewSequential(layers ...Layer) *Sequential {
	return &Sequential{layers: append([]Layer(nil), layers...)}
}

// Append adds a child at the end and returns s.
func (s *Sequential) Append(name string, m Module) *Sequential {
	s.layers = append(s.layers, Layer{Name: name, Module: m})
	return s
}

// Len returns the number of children.
func (s *Sequential) Len() int { return len(s.layers) }

// Layers returns the children (a copy of the slice; the modules are shared).
func (s *Sequential) Layers() []Layer { return append([]Layer(nil), s.layers...) }

// Offset is the index of the first child in the original model (0 unless s
// came from Slice).
func (s *Sequential) Offset() int { return s.base }

// Slice returns a Sequential of children i..j-1 that shares their modules and
// parameters with s, so a model can be split into contiguous ranges for
// pipeline stages. It panics if the range is invalid.
func (s *Sequential) Slice(i, j int) *Sequential {
	if i < 0 || j > len(s.layers) || i > j {
		panic(fmt.Sprintf("nn: Slice(%d, %d) of %d layers", i, j, len(s.layers)))
	}
	return &Sequential{layers: append([]Layer(nil), s.layers[i:j]...), base: s.base + i}
}

// Forward runs the children in order; the state holds one State per child.
func (s *Sequential) Forward(c Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	states := make([]State, len(s.layers))
	for i, l := range s.layers {
		x, states[i] = l.Module.Forward(c, x)
	}
	return x, states
}

// Backward runs the children backwards. A child may return a nil input
// gradient only if it is the first child (an Embedding); then Backward
// returns nil.
func (s *Sequential) Backward(st State, dy *tensor.Tensor) *tensor.Tensor {
	states := st.([]State)
	for i := len(s.layers) - 1; i >= 0; i-- {
		if dy == nil {
			panic(fmt.Sprintf("nn: layer %d (%s) returned no input gradient but is not the first layer", i+1+s.base, s.layers[i+1].Name))
		}
		dy = s.layers[i].Module.Backward(states[i], dy)
	}
	return dy
}

// prefix returns the parameter-name prefix of child i.
func (s *Sequential) prefix(i int) string {
	p := strconv.Itoa(s.base + i)
	if n := s.layers[i].Name; n != "" {
		p += "." + n
	}
	return p
}

// Params returns all children's parameters with prefixed names.
func (s *Sequential) Params() []*Param {
	var ps []*Param
	for i, l := range s.layers {
		ps = append(ps, prefixed(s.prefix(i), l.Module.Params())...)
	}
	return ps
}

// Cost sums the children's costs.
func (s *Sequential) Cost(in []int) Cost {
	c := Cost{OutShape: append([]int(nil), in...)}
	for _, l := range s.layers {
		c = c.Add(l.Module.Cost(c.OutShape))
	}
	return c
}

// LayerCosts returns the cost of every child for an input of shape in, in
// order; the allocator uses it to split a model into pipeline stages.
func (s *Sequential) LayerCosts(in []int) []Cost {
	out := make([]Cost, len(s.layers))
	for i, l := range s.layers {
		out[i] = l.Module.Cost(in)
		in = out[i].OutShape
	}
	return out
}

// Borrowed returns the parameters that s's children borrow (see Borrower)
// from modules outside s, each once, so a Sequential is itself a Borrower.
// It is empty for a whole GPT, whose tied head borrows from the embedding
// in the same model, and holds the token table for a slice that contains
// the head but not the embedding. Such a slice cannot be trained on its
// own: it reads its local copy of the table, which nothing updates, and its
// gradient for the table never reaches the owner. A pipeline must keep
// layers with ties in one stage or synchronise the borrowed values and
// gradients between stages.
func (s *Sequential) Borrowed() []*Param {
	owned := map[*tensor.Tensor]bool{}
	for _, l := range s.layers {
		for _, p := range l.Module.Params() {
			owned[p.Value] = true
		}
	}
	var out []*Param
	for _, l := range s.layers {
		b, ok := l.Module.(Borrower)
		if !ok {
			continue
		}
		for _, p := range b.Borrowed() {
			if !owned[p.Value] {
				owned[p.Value] = true // report once
				out = append(out, p)
			}
		}
	}
	return out
}
