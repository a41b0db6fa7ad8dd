package bench

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/tensor"
)

// layersSuite times forward+backward of one BERT-large encoder layer
// (hidden 1024, 16 heads, FFN 4096, seq 128; batch 8, or 2 with Quick) in
// training mode, against the time its FLOPs (from nn.Cost) would take at the
// GEMM speed measured in the same run on the layer's own projection and
// FFN GEMM shapes, forward and backward. The two are timed alternately.
// A ratio near 1 means the layer is GEMM-bound; the target is ≤ 1.5.
func layersSuite() Suite {
	return Suite{
		Name:  "layers",
		Short: "forward+backward of a BERT-large layer vs the GEMM-bound time of its FLOPs",
		Run:   runLayers,
	}
}

// layerGemm is one GEMM C[m,n] = op(A)·op(B) with inner dimension k.
type layerGemm struct {
	transA, transB bool
	m, n, k        int
}

// layerLinearGemms lists the forward GEMM and the two backward GEMMs of a Linear
// layer on rows×in inputs with out outputs, as nn.Linear issues them.
func layerLinearGemms(rows, in, out int) []layerGemm {
	return []layerGemm{
		{false, false, rows, out, in}, // y = x·W
		{true, false, in, out, rows},  // dW += xᵀ·dy
		{false, true, rows, in, out},  // dx = dy·Wᵀ
	}
}

// layerGemmRef holds buffers for replaying a list of GEMM shapes.
type layerGemmRef struct {
	shapes  []layerGemm
	a, b, c []float32
	flops   float64
}

func newLayerGemmRef(shapes []layerGemm, rng *rand.Rand) *layerGemmRef {
	r := &layerGemmRef{shapes: shapes}
	var na, nb, nc int
	for _, s := range shapes {
		na = max(na, s.m*s.k)
		nb = max(nb, s.k*s.n)
		nc = max(nc, s.m*s.n)
		r.flops += 2 * float64(s.m) * float64(s.n) * float64(s.k)
	}
	r.a, r.b, r.c = make([]float32, na), make([]float32, nb), make([]float32, nc)
	tensor.FillNormal(r.a, rng, 0, 1)
	tensor.FillNormal(r.b, rng, 0, 1)
	return r
}

func (r *layerGemmRef) run() {
	for _, s := range r.shapes {
		lda, ldb := s.k, s.n
		if s.transA {
			lda = s.m
		}
		if s.transB {
			ldb = s.k
		}
		tensor.Gemm(s.transA, s.transB, s.m, s.n, s.k, 1, r.a, lda, r.b, ldb, 0, r.c, s.n)
	}
}

func runLayers(ctx context.Context, o Options) ([]Result, error) {
	cfg := nn.BERTLarge()
	batch := 8
	if o.Quick {
		batch = 2
	}
	reps := max(o.Reps, 5)
	if !o.Quick {
		// More pairs: the machine is shared and single pairs are noisy.
		reps = max(reps, 9)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	layer := nn.NewEncoderLayer(cfg.Hidden, cfg.Heads, cfg.FFN, cfg.Dropout, rng)
	in := []int{batch, cfg.Seq, cfg.Hidden}
	cost := layer.Cost(in)
	x := tensor.New(in...)
	tensor.FillNormal(x.Data, rng, 0, 1)
	dy := tensor.New(in...)
	tensor.FillNormal(dy.Data, rng, 0, 1)
	fwd := nn.Ctx{Train: true}

	rows := batch * cfg.Seq
	var shapes []layerGemm
	for range 4 { // Q, K, V, output projections
		shapes = append(shapes, layerLinearGemms(rows, cfg.Hidden, cfg.Hidden)...)
	}
	shapes = append(shapes, layerLinearGemms(rows, cfg.Hidden, cfg.FFN)...)
	shapes = append(shapes, layerLinearGemms(rows, cfg.FFN, cfg.Hidden)...)
	ref := newLayerGemmRef(shapes, rng)

	step := func() {
		y, st := layer.Forward(fwd, x)
		_ = y
		layer.Backward(st, dy)
	}
	o.Logf("layers: BERT-large layer, batch %d, seq %d: %.1f GFLOP per step, %d reps, GEMM backend %s",
		batch, cfg.Seq, cost.TotalFLOPs()/1e9, reps, tensor.Backend())
	tl, tg, err := TimeAlternating(ctx, reps, 1, step, ref.run)
	if err != nil {
		return nil, err
	}
	ls, gs := Summarize(tl), Summarize(tg)
	gemmRate := ref.flops / gs.Median // FLOP/s
	bound := cost.TotalFLOPs() / gemmRate
	name := fmt.Sprintf("bert-large-b%d", batch)
	// The ratio of the fastest runs is less sensitive to other processes.
	minRatio := ls.Min / (cost.TotalFLOPs() / (ref.flops / gs.Min))
	note := fmt.Sprintf("GEMM backend %s; %.1f GFLOP fwd+bwd; ratio of minima %.3f", tensor.Backend(), cost.TotalFLOPs()/1e9, minRatio)
	return []Result{
		Result{Suite: "layers", Case: name, Metric: "fwd_bwd_time", Value: ls.Median, Unit: "s", Min: ls.Min, Max: ls.Max, Note: note}.
			WithBaseline("gemm_bound", bound),
		Result{Suite: "layers", Case: name, Metric: "layer_gflops", Value: cost.TotalFLOPs() / ls.Median / 1e9, Unit: "GFLOP/s",
			Min: cost.TotalFLOPs() / ls.Max / 1e9, Max: cost.TotalFLOPs() / ls.Min / 1e9}.
			WithBaseline("gemm", gemmRate/1e9),
		{Suite: "layers", Case: name, Metric: "gemm_gflops", Value: gemmRate / 1e9, Unit: "GFLOP/s",
			Min: ref.flops / gs.Max / 1e9, Max: ref.flops / gs.Min / 1e9, Note: "the layer's projection and FFN GEMM shapes, fwd+bwd"},
	}, nil
}
