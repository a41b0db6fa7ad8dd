package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/skyhive/skyhive/tensor"
)

// Dispatch is the expert half of one forward pass of a layer whose gate
// runs elsewhere (a PyTorch trainer's, through package bridge): the
// candidates the beam search found for each sample's scores and the
// answers of those that answered in time. The caller combines the answers
// (softmax over the candidates' scores) and differentiates the gate
// itself; DispatchBackward sends the answers' gradients to the experts.
type Dispatch struct {
	x     *tensor.Tensor
	cands [][]Candidate
	refs  [][]callRef
	ok    map[*call]bool
	row   int
}

// Input returns the input the experts were called with.
func (d *Dispatch) Input() *tensor.Tensor { return d.x }

// Candidates returns sample i's candidates, best first.
func (d *Dispatch) Candidates(i int) []Candidate { return d.cands[i] }

// Output returns the answer of sample i's j-th candidate (one row of the
// input's size), or nil when that expert did not answer.
func (d *Dispatch) Output(i, j int) []float32 {
	r := d.refs[i][j]
	if !d.ok[r.c] {
		return nil
	}
	return r.c.out.Data[r.pos*d.row : (r.pos+1)*d.row]
}

// DispatchCtx runs the beam search on scores (per grid dimension, n×size
// each, as the gate's outputs) for the n samples of x, calls the chosen
// experts in parallel with the layer's timeouts and k_min rule, and
// returns what they answered. Like ForwardCtx it fails, unless
// AllowZeroOutputs, when a sample is left with no answer.
func (m *MixtureOfExperts) DispatchCtx(ctx context.Context, x *tensor.Tensor, scores [][]float32) (*Dispatch, error) {
	n := x.Shape[0]
	if n == 0 || x.Shape[len(x.Shape)-1] != m.cfg.In {
		return nil, fmt.Errorf("moe/client: input shape %v, want [batch, …, %d]", x.Shape, m.cfg.In)
	}
	grid := m.cfg.Search.Grid()
	if len(scores) != len(grid.Size) {
		return nil, fmt.Errorf("moe/client: %d score vectors for a grid of %d dimensions", len(scores), len(grid.Size))
	}
	for dim, size := range grid.Size {
		if len(scores[dim]) != n*size {
			return nil, fmt.Errorf("moe/client: %d scores for dimension %d, want %d×%d", len(scores[dim]), dim, n, size)
		}
	}
	cands := m.cfg.Search.FindBest(ctx, n, scores, m.cfg.KBest, m.isDead)
	calls, refs := groupCalls(x, cands, m.newExpert)
	okCalls, errs := m.callExperts(ctx, calls, cands)
	d := &Dispatch{x: x, cands: cands, refs: refs, ok: okCalls, row: x.Len() / n}
	zero := 0
	for i := range n {
		answered := false
		for j := range refs[i] {
			answered = answered || okCalls[refs[i][j].c]
		}
		if !answered {
			zero++
		}
	}
	if zero > 0 && !m.cfg.AllowZeroOutputs {
		return d, fmt.Errorf("%w: %d of %d samples: %w", ErrNoExperts, zero, n, callErrors(errs))
	}
	return d, nil
}

// DispatchBackward sends every expert that answered d the gradients of its
// answers (dout(i, j): the gradient of sample i's j-th candidate's answer,
// nil for none) and returns the gradient with respect to the input, summed
// over the experts, and how many expert gradients each sample got. Like
// BackwardCtx it reports samples below BackwardKMin (the gradient is still
// returned).
func (m *MixtureOfExperts) DispatchBackward(ctx context.Context, d *Dispatch, dout func(i, j int) []float32) (*tensor.Tensor, []int, error) {
	if d == nil {
		return nil, nil, errors.New("moe/client: DispatchBackward needs a Dispatch")
	}
	n, row := d.x.Shape[0], d.row
	douts := map[*call]*tensor.Tensor{}
	for i := range n {
		for j, r := range d.refs[i] {
			if !d.ok[r.c] {
				continue
			}
			g := dout(i, j)
			if g == nil {
				continue
			}
			do := douts[r.c]
			if do == nil {
				do = tensor.New(r.c.x.Shape...)
				douts[r.c] = do
			}
			copy(do.Data[r.pos*row:(r.pos+1)*row], g)
		}
	}
	dx := tensor.New(d.x.Shape...)
	got, errs := m.sendBackward(ctx, douts, dx)
	return dx, got, m.checkBackwardKMin(got, func(i int) bool { return len(d.cands[i]) > 0 }, errs)
}
