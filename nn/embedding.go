package nn

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/skyhive/skyhive/tensor"
)

// Embedding maps token ids to learned vectors. Its input is a float32 tensor
// of integral token ids in [0, Vocab) of any shape (usually [batch, seq]);
// the output appends a Hidden dimension ([batch, seq, hidden]). The table
// ("weight", [Vocab, Hidden]) gets a scatter-added gradient.
//
// Token ids are not differentiable, so Backward returns nil: an Embedding
// must be the first layer of a model, and callers must not expect an input
// gradient from it.
type Embedding struct {
	Vocab, Hidden int
	Table         *Param
}

// NewEmbedding returns an embedding table drawn from N(0, std²).
func NewEmbedding(vocab, hidden int, std float64, rng *rand.Rand) *Embedding {
	t := tensor.New(vocab, hidden)
	fillNormal(t.Data, rng, std)
	return &Embedding{Vocab: vocab, Hidden: hidden, Table: newParam("weight", t)}
}

type embeddingState struct{ ids []int32 }

// Forward gathers one table row per token id. It panics on an id outside
// [0, Vocab), which is a data-preparation bug.
func (e *Embedding) Forward(_ Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	h := e.Hidden
	ids := make([]int32, x.Len())
	y := tensor.New(append(slices.Clone(x.Shape), h)...)
	for i, v := range x.Data {
		id := int(v)
		if id < 0 || id >= e.Vocab || float32(id) != v {
			panic(fmt.Sprintf("nn: Embedding: token id %v outside [0, %d)", v, e.Vocab))
		}
		ids[i] = int32(id)
		copy(y.Data[i*h:(i+1)*h], e.Table.Value.Data[id*h:(id+1)*h])
	}
	return y, embeddingState{ids: ids}
}

// Backward scatter-adds dy into the table gradient and returns nil.
func (e *Embedding) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	h := e.Hidden
	g := e.Table.Grad.Data
	for i, id := range s.(embeddingState).ids {
		tensor.Add(g[int(id)*h:(int(id)+1)*h], g[int(id)*h:(int(id)+1)*h], dy.Data[i*h:(i+1)*h])
	}
	return nil
}

// Params returns the table.
func (e *Embedding) Params() []*Param { return []*Param{e.Table} }

// Cost counts the copies as 1 FLOP per output element each way and holds the
// ids.
func (e *Embedding) Cost(in []int) Cost {
	n := numel(in)
	return Cost{
		ForwardFLOPs:    float64(n * e.Hidden),
		BackwardFLOPs:   float64(n * e.Hidden),
		Params:          int64(e.Vocab * e.Hidden),
		ActivationBytes: int64(n) * 4,
		OutShape:        append(slices.Clone(in), e.Hidden),
	}
}

// PositionalEmbedding adds a learned vector per position, as BERT does. Its
// input is [batch, seq, hidden] with seq ≤ MaxSeq; position s gets row s of
// the table ("weight", [MaxSeq, Hidden]).
type PositionalEmbedding struct {
	MaxSeq, Hidden int
	Table          *Param
}

// NewPositionalEmbedding returns a table drawn from N(0, std²).
func NewPositionalEmbedding(maxSeq, hidden int, std float64, rng *rand.Rand) *PositionalEmbedding {
	t := tensor.New(maxSeq, hidden)
	fillNormal(t.Data, rng, std)
	return &PositionalEmbedding{MaxSeq: maxSeq, Hidden: hidden, Table: newParam("weight", t)}
}

func (p *PositionalEmbedding) dims(shape []int) (batch, seq int) {
	if len(shape) != 3 || shape[2] != p.Hidden || shape[1] > p.MaxSeq {
		panic(fmt.Sprintf("nn: PositionalEmbedding expects [batch, seq<=%d, %d], got %v", p.MaxSeq, p.Hidden, shape))
	}
	return shape[0], shape[1]
}

// Forward returns x + table[position].
func (p *PositionalEmbedding) Forward(_ Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	b, s := p.dims(x.Shape)
	n := s * p.Hidden
	y := tensor.New(x.Shape...)
	for i := 0; i < b; i++ {
		tensor.Add(y.Data[i*n:(i+1)*n], x.Data[i*n:(i+1)*n], p.Table.Value.Data[:n])
	}
	return y, x.Shape
}

// Backward adds the batch sum of dy into the table gradient and returns dy.
func (p *PositionalEmbedding) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	b, sq := p.dims(dy.Shape)
	n := sq * p.Hidden
	g := p.Table.Grad.Data[:n]
	for i := 0; i < b; i++ {
		tensor.Add(g, g, dy.Data[i*n:(i+1)*n])
	}
	return dy
}

// Params returns the table.
func (p *PositionalEmbedding) Params() []*Param { return []*Param{p.Table} }

// Cost counts one add per element each way; nothing is held.
func (p *PositionalEmbedding) Cost(in []int) Cost {
	p.dims(in)
	n := numel(in)
	return Cost{ForwardFLOPs: float64(n), BackwardFLOPs: float64(n), Params: int64(p.MaxSeq * p.Hidden), OutShape: slices.Clone(in)}
}
