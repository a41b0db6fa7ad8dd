package nn

import (
	"fmt"

	"github.com/skyhive/skyhive/tensor"
)

// Borrower is implemented by modules that use parameters owned by another
// module of the same model. A borrower leaves those parameters out of its
// Params, so a model holding both the owner and the borrower lists (and an
// optimizer updates) each parameter once; the borrower's Backward adds its
// gradient contribution into the owner's Param.Grad, so the gradient there is
// the sum over every use.
type Borrower interface {
	// Borrowed returns the parameters the module uses but does not own.
	Borrowed() []*Param
}

var (
	_ Borrower = (*TiedHead)(nil)
	_ Borrower = (*Sequential)(nil)
)

// TiedHead is GPT's output layer: logits = x·Tableᵀ on the last dimension,
// [.., Hidden] → [.., Vocab], where Table ([Vocab, Hidden]) is the token
// Embedding's table itself (weight tying, Press & Wolf 2017). It has no bias
// and no parameters of its own: Params returns nil and Borrowed returns the
// table.
type TiedHead struct {
	Vocab, Hidden int
	Table         *Param
}

// NewTiedHead returns an output head that shares e's table.
func NewTiedHead(e *Embedding) *TiedHead {
	return &TiedHead{Vocab: e.Vocab, Hidden: e.Hidden, Table: e.Table}
}

type tiedHeadState struct{ x *tensor.Tensor }

// Forward computes x·Tableᵀ.
func (t *TiedHead) Forward(_ Ctx, x *tensor.Tensor) (*tensor.Tensor, State) {
	checkLast("TiedHead", x.Shape, t.Hidden)
	rows, _ := rowsOf(x.Shape)
	y := tensor.New(withLast(x.Shape, t.Vocab)...)
	tensor.Gemm(false, true, rows, t.Vocab, t.Hidden, 1, x.Data, t.Hidden, t.Table.Value.Data, t.Hidden, 0, y.Data, t.Vocab)
	return y, tiedHeadState{x: x}
}

// Backward adds dyᵀ·x into the table's gradient and returns dy·Table.
func (t *TiedHead) Backward(s State, dy *tensor.Tensor) *tensor.Tensor {
	x := s.(tiedHeadState).x
	rows, _ := rowsOf(x.Shape)
	if dy.Len() != rows*t.Vocab {
		panic(fmt.Sprintf("nn: TiedHead: gradient of shape %v for input %v", dy.Shape, x.Shape))
	}
	tensor.Gemm(true, false, t.Vocab, t.Hidden, rows, 1, dy.Data, t.Vocab, x.Data, t.Hidden, 1, t.Table.Grad.Data, t.Hidden)
	dx := tensor.New(x.Shape...)
	tensor.Gemm(false, false, rows, t.Hidden, t.Vocab, 1, dy.Data, t.Vocab, t.Table.Value.Data, t.Hidden, 0, dx.Data, t.Hidden)
	return dx
}

// Params returns nil: the table belongs to the embedding.
func (t *TiedHead) Params() []*Param { return nil }

// Borrowed returns the embedding table.
func (t *TiedHead) Borrowed() []*Param { return []*Param{t.Table} }

// Cost counts one GEMM forward and two backward; the input is held. Params
// is 0 because the table is counted with the embedding that owns it.
func (t *TiedHead) Cost(in []int) Cost {
	checkLast("TiedHead", in, t.Hidden)
	rows, _ := rowsOf(in)
	f := 2 * float64(rows) * float64(t.Hidden) * float64(t.Vocab)
	return Cost{
		ForwardFLOPs:    f,
		BackwardFLOPs:   2 * f,
		ActivationBytes: int64(rows*t.Hidden) * f32,
		OutShape:        withLast(in, t.Vocab),
	}
}
