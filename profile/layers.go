package profile

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/skyhive/skyhive/alloc"
	"github.com/skyhive/skyhive/models"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
)

// bytesPerFloat is the size of a float32 parameter or activation.
const bytesPerFloat = 4

// DefaultLayerReps is the number of timed repetitions per layer.
const DefaultLayerReps = 3

// Layer is one layer's profile for a whole batch.
type Layer struct {
	// Name is the layer's name in its Sequential ("fc", "enc", …) with its
	// index, e.g. "3.enc".
	Name string `json:"name"`
	// FwdFLOPs and BwdFLOPs count the forward and backward FLOPs
	// (a multiply-add is 2), from nn.Cost.
	FwdFLOPs float64 `json:"fwd_flops"`
	BwdFLOPs float64 `json:"bwd_flops"`
	// Params is the number of trainable scalars; ParamBytes their size.
	Params     int64 `json:"params"`
	ParamBytes int64 `json:"param_bytes"`
	// ActivationBytes is the memory held from forward to backward.
	ActivationBytes int64 `json:"activation_bytes"`
	// OutShape is the output's shape; OutputBytes its size, which is what a
	// pipeline stage ending here sends to the next one.
	OutShape    []int `json:"out_shape"`
	OutputBytes int64 `json:"output_bytes"`
	// FwdSeconds and BwdSeconds are measured medians (0: not measured).
	FwdSeconds float64 `json:"fwd_s,omitempty"`
	BwdSeconds float64 `json:"bwd_s,omitempty"`
}

// Alloc returns the layer as the allocator sees it, with counted FLOPs.
func (l Layer) Alloc() alloc.Layer {
	return alloc.Layer{
		Name:            l.Name,
		FwdFLOPs:        l.FwdFLOPs,
		BwdFLOPs:        l.BwdFLOPs,
		ParamBytes:      l.ParamBytes,
		ActivationBytes: l.ActivationBytes,
		OutputBytes:     l.OutputBytes,
	}
}

// LayerOptions configures Layers.
type LayerOptions struct {
	// Measure times every layer's forward and backward pass.
	Measure bool
	// Reps is the number of timed repetitions per layer after one warm-up
	// (default DefaultLayerReps).
	Reps int
	// Input, if set, is the measured model's input (its shape must be the
	// in shape). Otherwise the input is drawn from N(0, 1), which suits
	// models on real-valued inputs but not token ids.
	Input *tensor.Tensor
	// Seed draws the input and the output gradients.
	Seed uint64
}

// Layers profiles every child of model for an input of shape in (batch
// first): costs from nn.Module.Cost and, with o.Measure, the median forward
// (training mode) and backward times. Measuring honours ctx between passes.
func Layers(ctx context.Context, model *nn.Sequential, in []int, o LayerOptions) ([]Layer, error) {
	if len(in) == 0 || slices.ContainsFunc(in, func(d int) bool { return d <= 0 }) {
		return nil, fmt.Errorf("profile: input shape %v must be non-empty and positive", in)
	}
	children := model.Layers()
	if len(children) == 0 {
		return nil, errors.New("profile: model has no layers")
	}
	costs := model.LayerCosts(in)
	out := make([]Layer, len(children))
	for i, c := range costs {
		name := strconv.Itoa(model.Offset() + i)
		if n := children[i].Name; n != "" {
			name += "." + n
		}
		out[i] = Layer{
			Name:            name,
			FwdFLOPs:        c.ForwardFLOPs,
			BwdFLOPs:        c.BackwardFLOPs,
			Params:          c.Params,
			ParamBytes:      c.Params * bytesPerFloat,
			ActivationBytes: c.ActivationBytes,
			OutShape:        slices.Clone(c.OutShape),
			OutputBytes:     int64(tensor.NumElements(c.OutShape)) * bytesPerFloat,
		}
	}
	if !o.Measure {
		return out, nil
	}
	reps := o.Reps
	if reps <= 0 {
		reps = DefaultLayerReps
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x2545f4914f6cdd1d))
	x := o.Input
	if x == nil {
		x = tensor.New(in...)
		tensor.FillNormal(x.Data, rng, 0, 1)
	} else if !tensor.SameShape(x.Shape, in) {
		return nil, fmt.Errorf("profile: input of shape %v, want %v", x.Shape, in)
	}
	c := nn.Ctx{Train: true}
	for i, ch := range children {
		m := ch.Module
		dy := tensor.New(out[i].OutShape...)
		tensor.FillNormal(dy.Data, rng, 0, 1)
		fwd := make([]float64, 0, reps)
		bwd := make([]float64, 0, reps)
		var y *tensor.Tensor
		for r := -1; r < reps; r++ { // r = -1 is the warm-up
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("profile: measuring layer %s: %w", out[i].Name, err)
			}
			g := dy.Clone() // a Backward may overwrite its gradient
			t0 := time.Now()
			yy, st := m.Forward(c, x)
			t1 := time.Now()
			m.Backward(st, g)
			t2 := time.Now()
			if r >= 0 {
				fwd = append(fwd, t1.Sub(t0).Seconds())
				bwd = append(bwd, t2.Sub(t1).Seconds())
			}
			y = yy
		}
		if !tensor.SameShape(y.Shape, out[i].OutShape) {
			return nil, fmt.Errorf("profile: layer %s: output shape %v, its Cost says %v", out[i].Name, y.Shape, out[i].OutShape)
		}
		out[i].FwdSeconds, _, _ = medianMinMax(fwd)
		out[i].BwdSeconds, _, _ = medianMinMax(bwd)
		x = y
	}
	nn.ZeroGrad(model.Params())
	return out, nil
}

// ModelLayers profiles a model by name for a batch and returns its profile:
//
//   - a spec of the model registry (package models: "mlp", "bert-tiny",
//     "deep-mlp:512x16", ...), a Fashion-MNIST classifier on
//     [batch, 784] inputs (default batch 128);
//   - "bert-large:N" and "bert-base:N": N BERT encoder layers (package nn)
//     on [batch, 128, hidden] inputs (default batch alloc.DefaultBatch).
//     The layers are identical, so one is built and profiled and its profile
//     repeated N times; the memory of a 24-layer BERT-large is never needed.
func ModelLayers(ctx context.Context, spec string, batch int, o LayerOptions) (*ModelProfile, error) {
	var (
		model  *nn.Sequential
		in     []int
		repeat = 1
		err    error
	)
	name, count, _ := strings.Cut(spec, ":")
	switch name {
	case "bert-large", "bert-base":
		cfg := nn.BERTLarge()
		if name == "bert-base" {
			cfg = nn.BERTBase()
		}
		n, cerr := strconv.Atoi(count)
		if cerr != nil || n <= 0 {
			return nil, fmt.Errorf("profile: bad encoder spec %q (want %s:N with N ≥ 1; or %s)", spec, name, models.Usage())
		}
		if batch <= 0 {
			batch = alloc.DefaultBatch
		}
		cfg.Layers = 1
		model, err = nn.BERTEncoder(cfg, rand.New(rand.NewPCG(o.Seed, 0x5eed)))
		if err != nil {
			return nil, fmt.Errorf("profile: %w", err)
		}
		in = []int{batch, cfg.Seq, cfg.Hidden}
		repeat = n
	default:
		if batch <= 0 {
			batch = 128
		}
		model, err = models.Build(spec, o.Seed)
		if err != nil {
			return nil, fmt.Errorf("profile: %w; or encoder layers bert-large:N or bert-base:N", err)
		}
		in = []int{batch, models.InputFeatures}
	}
	layers, err := Layers(ctx, model, in, o)
	if err != nil {
		return nil, err
	}
	if repeat > 1 {
		one := layers[0]
		layers = make([]Layer, repeat)
		for i := range layers {
			layers[i] = one
			layers[i].Name = fmt.Sprintf("%d.enc", i)
			layers[i].OutShape = slices.Clone(one.OutShape)
		}
	}
	mp := &ModelProfile{
		Format:  ModelFormat,
		Name:    spec,
		Batch:   batch,
		InShape: in,
		Layers:  layers,
	}
	if o.Measure {
		mp.Backend = tensor.Backend()
		mp.CPUs = runtime.GOMAXPROCS(0)
	}
	return mp, nil
}
