package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
)

// Model is the trainer side of a DMoE classifier as in Learning@home's
// experiments: a local input layer Linear(Inputs, Hidden)·ReLU, a stack of
// MixtureOfExperts layers whose experts live on servers, and a local
// classifier Linear(Hidden, Classes). Only the local layers and the gates
// have parameters here; the experts are trained by their servers from the
// backward calls.
type Model struct {
	In  *nn.Linear
	MoE []*MixtureOfExperts
	Out *nn.Linear
}

// NewModel builds a model whose DMoE layers use the given configurations
// (each with In equal to hidden).
func NewModel(inputs, hidden, classes int, layers []Config, seed uint64) (*Model, error) {
	rng := rand.New(rand.NewPCG(seed, 0x30de1))
	m := &Model{
		In:  nn.NewLinear(inputs, hidden, nn.HeStd(inputs), rng),
		Out: nn.NewLinear(hidden, classes, nn.XavierStd(hidden, classes), rng),
	}
	for i, c := range layers {
		if c.In != hidden {
			return nil, fmt.Errorf("moe/client: layer %d has input size %d, want %d", i, c.In, hidden)
		}
		c.Seed = seed + uint64(i)*7919
		l, err := New(c)
		if err != nil {
			return nil, err
		}
		m.MoE = append(m.MoE, l)
	}
	return m, nil
}

// Params lists the local parameters: "in.*", "moeI.gate.*", "out.*".
func (m *Model) Params() []*nn.Param {
	pre := func(p string, ps []*nn.Param) []*nn.Param {
		out := make([]*nn.Param, len(ps))
		for i, q := range ps {
			out[i] = &nn.Param{Name: p + q.Name, Value: q.Value, Grad: q.Grad}
		}
		return out
	}
	ps := pre("in.", m.In.Params())
	for i, l := range m.MoE {
		ps = append(ps, pre(fmt.Sprintf("moe%d.", i), l.Params())...)
	}
	return append(ps, pre("out.", m.Out.Params())...)
}

type modelState struct {
	in, out nn.State
	act     *tensor.Tensor
	moeOut  *tensor.Tensor
	moe     []nn.State
}

// Predict returns the logits. It fails if a DMoE layer leaves a sample
// without any answering expert. Several Predict calls may run at once.
func (m *Model) Predict(ctx context.Context, x *tensor.Tensor) (*tensor.Tensor, error) {
	y, _, err := m.forward(ctx, x)
	return y, err
}

func (m *Model) forward(ctx context.Context, x *tensor.Tensor) (*tensor.Tensor, *modelState, error) {
	st := &modelState{}
	h, s := m.In.Forward(nn.Ctx{}, x)
	st.in = s
	tensor.ReLU(h.Data, h.Data)
	st.act = h
	for i, l := range m.MoE {
		y, s, err := l.ForwardCtx(ctx, h)
		if err != nil {
			return nil, nil, fmt.Errorf("dmoe layer %d: %w", i, err)
		}
		st.moe = append(st.moe, s)
		h = y
	}
	st.moeOut = h
	logits, s := m.Out.Forward(nn.Ctx{}, h)
	st.out = s
	return logits, st, nil
}

// Step runs forward and backward on one batch, accumulating the local
// gradients (the caller zeroes them and steps its optimizer) while the
// servers update the experts. It returns the loss and accuracy.
func (m *Model) Step(ctx context.Context, x *tensor.Tensor, labels []int) (float32, float64, error) {
	logits, st, err := m.forward(ctx, x)
	if err != nil {
		return 0, 0, err
	}
	loss, dl := nn.SoftmaxCrossEntropy(logits, labels)
	acc := nn.Accuracy(logits, labels)
	dh := m.Out.Backward(st.out, dl)
	for i := len(m.MoE) - 1; i >= 0; i-- {
		dh, err = m.MoE[i].BackwardCtx(ctx, st.moe[i], dh)
		if err != nil {
			return loss, acc, fmt.Errorf("dmoe layer %d backward: %w", i, err)
		}
	}
	tensor.ReLUBackward(dh.Data, st.act.Data, dh.Data)
	m.In.Backward(st.in, dh)
	return loss, acc, nil
}

// Deferred holds what the local layers' gradients are computed from, so
// that they can be computed later against fresher weights (see
// StepDeferred).
type Deferred struct {
	// X is the batch, H the input of the classifier, Labels the targets.
	X, H   *tensor.Tensor
	Labels []int
	// DAct is the gradient of the loss with respect to the input layer's
	// activation (after the ReLU), from the DMoE stack.
	DAct *tensor.Tensor
}

// StepDeferred is Step for asynchronous trainers that share their local
// layers: it runs forward and backward through the DMoE layers (the gates'
// gradients accumulate as usual and the servers update the experts) but
// leaves the gradients of the input layer and the classifier to
// ApplyDeferred, which recomputes them with the weights current at that
// time, as expert servers recompute their forward pass on backward calls.
func (m *Model) StepDeferred(ctx context.Context, x *tensor.Tensor, labels []int) (Deferred, float32, float64, error) {
	logits, st, err := m.forward(ctx, x)
	if err != nil {
		return Deferred{}, 0, 0, err
	}
	loss, dl := nn.SoftmaxCrossEntropy(logits, labels)
	acc := nn.Accuracy(logits, labels)
	var h *tensor.Tensor = st.act
	if n := len(m.MoE); n > 0 {
		h = st.moeOut
	}
	// dh = dl·Woutᵀ without touching the classifier's gradients.
	dh := tensor.New(h.Shape...)
	tensor.Gemm(false, true, dl.Shape[0], m.Out.In, m.Out.Out, 1, dl.Data, m.Out.Out, m.Out.W.Value.Data, m.Out.Out, 0, dh.Data, m.Out.In)
	for i := len(m.MoE) - 1; i >= 0; i-- {
		dh, err = m.MoE[i].BackwardCtx(ctx, st.moe[i], dh)
		if err != nil {
			return Deferred{}, loss, acc, fmt.Errorf("dmoe layer %d backward: %w", i, err)
		}
	}
	return Deferred{X: x, H: h, Labels: labels, DAct: dh}, loss, acc, nil
}

// ApplyDeferred adds the input layer's and the classifier's gradients for
// d, computed with the model's current weights.
func (m *Model) ApplyDeferred(d Deferred) {
	logits, so := m.Out.Forward(nn.Ctx{}, d.H)
	_, dl := nn.SoftmaxCrossEntropy(logits, d.Labels)
	m.Out.Backward(so, dl)
	z, si := m.In.Forward(nn.Ctx{}, d.X)
	dz := tensor.New(z.Shape...)
	tensor.ReLUBackward(dz.Data, z.Data, d.DAct.Data)
	m.In.Backward(si, dz)
}

// Evaluate returns the mean loss and accuracy on ds, running up to
// parallel batches at once (their expert calls overlap).
func (m *Model) Evaluate(ctx context.Context, ds *data.Dataset, batch, parallel int) (float64, float64, error) {
	n := ds.Len()
	parallel = max(parallel, 1)
	type part struct{ loss, correct float64 }
	nb := (n + batch - 1) / batch
	parts := make([]part, nb)
	errs := make([]error, nb)
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for k := range nb {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			lo, hi := k*batch, min((k+1)*batch, n)
			idx := make([]int, hi-lo)
			for i := range idx {
				idx[i] = lo + i
			}
			b := ds.Gather(idx)
			logits, err := m.Predict(ctx, b.X)
			if err != nil {
				errs[k] = err
				return
			}
			l, _ := nn.SoftmaxCrossEntropy(logits, b.Y)
			parts[k] = part{float64(l) * float64(hi-lo), nn.Accuracy(logits, b.Y) * float64(hi-lo)}
		})
	}
	wg.Wait()
	var loss, correct float64
	for k := range parts {
		if errs[k] != nil {
			return 0, 0, errs[k]
		}
		loss += parts[k].loss
		correct += parts[k].correct
	}
	return loss / float64(n), correct / float64(n), nil
}
