package optimizer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p/memnet"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// swarm builds one Optimizer per peer on a fresh memnet network, every
// peer's handlers registered before any steps; mk returns peer p's inner
// optimizer and config (Rank and Roster are filled in).
func swarm(t *testing.T, peers int, acfg averaging.Config, mk func(p int) (optim.Optimizer, Config)) []*Optimizer {
	t.Helper()
	net := memnet.NewNetwork()
	t.Cleanup(func() { net.Close() })
	var roster []averaging.Member
	var ps []*memnet.Peer
	for range peers {
		p, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
		roster = append(roster, averaging.Member{Peer: p.AddrInfo(), Weight: 1})
	}
	opts := make([]*Optimizer, peers)
	for p := range peers {
		a := averaging.New(ps[p], acfg)
		t.Cleanup(func() { a.Close() })
		inner, cfg := mk(p)
		cfg.Rank, cfg.Roster = p, roster
		o, err := New(a, inner, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { o.Close() })
		opts[p] = o
	}
	return opts
}

// train runs every peer's loop concurrently: steps times, grad(p, s) sets
// peer p's gradients, then Step. It returns the final snapshots.
func train(t *testing.T, opts []*Optimizer, steps int, grad func(p, s int)) [][]float32 {
	t.Helper()
	var wg sync.WaitGroup
	got := make([][]float32, len(opts))
	for p, o := range opts {
		wg.Go(func() {
			for s := range steps {
				o.ZeroGrad()
				grad(p, s)
				if err := o.Step(context.Background(), 1); err != nil {
					t.Error(err)
					return
				}
			}
			got[p] = o.Snapshot()
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return got
}

// maxDiff is the largest element-wise difference of a and b.
func maxDiff(a, b []float32) float64 {
	var worst float64
	for j := range a {
		worst = max(worst, math.Abs(float64(a[j]-b[j])))
	}
	return worst
}

// blobTask is a small classification task: per-peer batches of an MLP.
type blobTask struct {
	ds         *data.Dataset
	peers, per int
}

func newBlobTask(t *testing.T, peers, per, steps int) blobTask {
	t.Helper()
	ds, err := data.GaussianBlobs(peers*per*steps, 20, 3, 5)
	if err != nil {
		t.Fatal(err)
	}
	return blobTask{ds: ds, peers: peers, per: per}
}

func (blobTask) build() *nn.Sequential {
	return nn.MLP([]int{20, 16, 3}, 0, rand.New(rand.NewPCG(3, 4)))
}

// replicas are a one-process reference's models, one per peer, each with
// its own SGD, and their common initial parameters.
func (b blobTask) replicas(sgd optim.SGDConfig) ([]*nn.Sequential, []*optim.SGD, []float32) {
	reps := make([]*nn.Sequential, b.peers)
	opts := make([]*optim.SGD, b.peers)
	for p := range reps {
		reps[p] = b.build()
		opts[p] = optim.NewSGD(reps[p].Params(), sgd)
	}
	start := make([]float32, nn.NumParams(reps[0].Params()))
	nn.FlatValues(reps[0].Params(), start)
	return reps, opts, start
}

// batch is peer p's batch of step s.
func (b blobTask) batch(s, p int) []int {
	idx := make([]int, b.per)
	for i := range idx {
		idx[i] = (s*b.peers+p)*b.per + i
	}
	return idx
}

// grad accumulates m's gradient of the mean loss on idx.
func (b blobTask) grad(m *nn.Sequential, idx []int) {
	x := b.ds.Gather(idx)
	logits, st := m.Forward(nn.Ctx{Train: true}, x.X)
	_, d := nn.SoftmaxCrossEntropy(logits, x.Y)
	m.Backward(st, d)
}

// TestDiLoCoH1EqualsAllReduceSGD: with one inner step, outer learning rate
// 1 and no outer momentum, DiLoCo's outer step is θ − mean(lr·g_i): P peers
// take exactly the steps of one process running plain SGD on the union of
// their batches.
func TestDiLoCoH1EqualsAllReduceSGD(t *testing.T) {
	const peers, per, steps = 3, 8, 6
	task := newBlobTask(t, peers, per, steps)
	sgd := optim.SGDConfig{LR: 0.1}

	ref := task.build()
	refOpt := optim.NewSGD(ref.Params(), sgd)
	for s := range steps {
		refOpt.ZeroGrad()
		var all []int
		for p := range peers {
			all = append(all, task.batch(s, p)...)
		}
		task.grad(ref, all)
		refOpt.Step()
	}
	want := make([]float32, nn.NumParams(ref.Params()))
	nn.FlatValues(ref.Params(), want)

	models := make([]*nn.Sequential, peers)
	opts := swarm(t, peers, averaging.Config{Timeout: 10 * time.Second, ChunkElems: 100}, func(p int) (optim.Optimizer, Config) {
		models[p] = task.build()
		return optim.NewSGD(models[p].Params(), sgd), Config{Algo: DiLoCo, InnerSteps: 1, OuterLR: 1, OuterMomentum: NoMomentum}
	})
	got := train(t, opts, steps, func(p, s int) { task.grad(models[p], task.batch(s, p)) })
	for p, o := range opts {
		if d := maxDiff(got[p], want); d > 1e-5 {
			t.Errorf("peer %d differs from large-batch SGD by %v", p, d)
		}
		if st := o.Stats(); st.OuterSteps != steps || st.GlobalSyncs != steps || st.Failures > 0 || st.BytesSent == 0 {
			t.Errorf("peer %d: %+v", p, st)
		}
	}
}

// TestDiLoCoNesterovMatchesReference: H > 1 inner steps of SGD with
// momentum (whose state carries over outer steps), then the outer Nesterov
// step; the reference simulates the replicas in one process and writes
// the outer step from its formula.
func TestDiLoCoNesterovMatchesReference(t *testing.T) {
	testDiLoCoMatchesReference(t, Config{Algo: DiLoCo, InnerSteps: 3}, []int{3, 3, 3})
}

// TestDiLoCoWarmupMatchesReference: with a warm-up the outer steps come
// after 1, 2, 4, then H = 5 inner steps, and the peers still compute the
// reference's outer steps; the schedule itself doubles from the warm-up's
// H up to H.
func TestDiLoCoWarmupMatchesReference(t *testing.T) {
	testDiLoCoMatchesReference(t, Config{Algo: DiLoCo, InnerSteps: 5, WarmupInnerSteps: 1}, []int{1, 2, 4, 5, 5})
	for _, c := range []struct {
		h, h0 int
		want  []int
	}{
		{20, 3, []int{3, 6, 12, 20, 20}},
		{20, 0, []int{20, 20}},
		{20, 20, []int{20, 20}},
		{250, 10, []int{10, 20, 40, 80, 160, 250, 250}},
	} {
		d := &outer{h: c.h, h0: c.h0}
		for k, want := range c.want {
			if got := d.innerSteps(k); got != want {
				t.Errorf("H %d, warm-up %d: outer step %d after %d inner steps, want %d", c.h, c.h0, k, got, want)
			}
		}
		if got := d.innerSteps(1 << 40); got != c.h {
			t.Errorf("H %d, warm-up %d: late outer step after %d inner steps", c.h, c.h0, got)
		}
	}
}

// testDiLoCoMatchesReference trains 3 DiLoCo peers with cfg (default
// outer η 0.7 and μ 0.9, SGD with momentum inside) against a one-process
// reference whose k-th outer step follows schedule[k] inner steps.
func testDiLoCoMatchesReference(t *testing.T, cfg Config, schedule []int) {
	t.Helper()
	const peers, per = 3, 8
	const eta, mu = 0.7, 0.9
	steps := 0
	for _, h := range schedule {
		steps += h
	}
	task := newBlobTask(t, peers, per, steps)
	sgd := optim.SGDConfig{LR: 0.05, Momentum: 0.9}

	// Reference: replicas with their own inner optimizers.
	reps, repOpts, start := task.replicas(sgd)
	n := len(start)
	v := make([]float32, n)
	theta := make([]float32, n)
	done := 0
	for _, h := range schedule {
		mean := make([]float64, n)
		for p := range peers {
			for i := range h {
				repOpts[p].ZeroGrad()
				task.grad(reps[p], task.batch(done+i, p))
				repOpts[p].Step()
			}
			nn.FlatValues(reps[p].Params(), theta)
			for j := range n {
				mean[j] += float64(start[j]-theta[j]) / peers
			}
		}
		done += h
		for j := range n {
			g := float32(mean[j])
			v[j] = mu*v[j] + g
			start[j] -= eta * (g + mu*v[j])
		}
		for p := range peers {
			nn.SetFlatValues(reps[p].Params(), start)
		}
	}

	models := make([]*nn.Sequential, peers)
	opts := swarm(t, peers, averaging.Config{Timeout: 10 * time.Second, ChunkElems: 100}, func(p int) (optim.Optimizer, Config) {
		models[p] = task.build()
		// OuterLR and OuterMomentum are the defaults (0.7, 0.9).
		return optim.NewSGD(models[p].Params(), sgd), cfg
	})
	got := train(t, opts, steps, func(p, s int) { task.grad(models[p], task.batch(s, p)) })
	for p, o := range opts {
		if d := maxDiff(got[p], start); d > 1e-5 {
			t.Errorf("peer %d differs from the reference by %v", p, d)
		}
		if d := maxDiff(outerOf(o).mom, v); d > 1e-5 {
			t.Errorf("peer %d: outer momentum differs from the reference by %v", p, d)
		}
		if st := o.Stats(); st.OuterSteps != len(schedule) || st.Round != len(schedule) || st.Steps != steps || st.Refused != 0 {
			t.Errorf("peer %d: %+v", p, st)
		}
	}
}

// TestWADiLoCoWarmupIsDiLoCo: WA-DiLoCo's warm-up outer steps are
// DiLoCo's, synchronous with every peer and unannounced (an announcement
// of round 1 or 2 with τ = 3 would be refused, and one of a multiple of τ
// would start a background step of the same session): after 1 and 2 inner
// steps the peers equal the reference, before any group forms.
func TestWADiLoCoWarmupIsDiLoCo(t *testing.T) {
	testDiLoCoMatchesReference(t, Config{Algo: WADiLoCo, InnerSteps: 4, WarmupInnerSteps: 1, Tau: 3, GroupSize: 3}, []int{1, 2})
	d := &outer{h: 4, h0: 1}
	if !d.warming(0) || !d.warming(1) || d.warming(2) || d.warming(100) {
		t.Errorf("warm-up rounds of H 4 from 1: %v %v %v %v", d.warming(0), d.warming(1), d.warming(2), d.warming(100))
	}
	if (&outer{h: 4}).warming(0) {
		t.Error("no warm-up, yet warming")
	}
}

// quantileCodebook reads the 256-entry codebook of a quantile8 wire
// encoding of n elements: the 1 KiB before the n codes.
func quantileCodebook(t *testing.T, x []float32) []float32 {
	t.Helper()
	b, err := wire.Marshal(tensor.FromSlice(x, len(x)), wire.Options{Codec: wire.CodecQuantile8})
	if err != nil {
		t.Fatal(err)
	}
	raw := b[len(b)-len(x)-4*256 : len(b)-len(x)]
	cb := make([]float32, 256)
	for i := range cb {
		cb[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return cb
}

// halfGap is quantile8's documented bound for v: half the gap between the
// two codebook entries around it.
func halfGap(cb []float32, v float32) float64 {
	i, _ := slices.BinarySearch(cb, v)
	if i == 0 || i == len(cb) || cb[i] == v {
		return 0
	}
	return (float64(cb[i]) - float64(cb[i-1])) / 2
}

// roundTrip is what a reducer decodes of x sent with codec.
func roundTrip(t *testing.T, x []float32, codec wire.Codec) []float32 {
	t.Helper()
	b, err := wire.Marshal(tensor.FromSlice(slices.Clone(x), len(x)), wire.Options{Codec: codec})
	if err != nil {
		t.Fatal(err)
	}
	y, err := wire.Unmarshal(b, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return y.Data
}

// TestDiLoCoCompressedPseudoGradientWithinCodecBound: the averaged
// pseudo-gradient of an outer step, sent with a lossy codec, differs from
// the exact mean of the peers' pseudo-gradients by no more than the codec's
// documented error, applied once to each contribution a reducer decodes
// and once to the mean it sends back. The weights are large (≈50) and the
// pseudo-gradients small (≈0.01): compressing weights instead would break
// the bound by orders of magnitude.
func TestDiLoCoCompressedPseudoGradientWithinCodecBound(t *testing.T) {
	const peers, n = 3, 3000
	rng := rand.New(rand.NewPCG(11, 12))
	theta0 := make([]float32, n)
	for j := range theta0 {
		theta0[j] = 50 + float32(rng.NormFloat64())
	}
	grads := make([][]float32, peers)
	deltas := make([][]float32, peers) // exactly as the optimizer computes them
	for p := range grads {
		grads[p] = make([]float32, n)
		deltas[p] = make([]float32, n)
		for j := range n {
			grads[p][j] = 0.01 * float32(1+j%7) * float32(rng.NormFloat64())
			deltas[p][j] = theta0[j] - (theta0[j] - grads[p][j])
		}
	}
	exact := make([]float32, n)
	for j := range n {
		var s float64
		for p := range peers {
			s += float64(deltas[p][j])
		}
		exact[j] = float32(s / peers)
	}
	bounds, err := averaging.Partition(n, slices.Repeat([]float64{1}, peers))
	if err != nil {
		t.Fatal(err)
	}
	const eps = 0x1p-24 // float32 rounding of the reducer's sum

	for _, codec := range []wire.Codec{wire.CodecFP16, wire.CodecUniform8, wire.CodecQuantile8} {
		t.Run(codec.String(), func(t *testing.T) {
			opts := swarm(t, peers, averaging.Config{Codec: codec, Timeout: 10 * time.Second}, func(p int) (optim.Optimizer, Config) {
				w := &nn.Param{Name: "w", Value: tensor.FromSlice(slices.Clone(theta0), n), Grad: tensor.New(n)}
				return optim.NewSGD([]*nn.Param{w}, optim.SGDConfig{LR: 1}), Config{Algo: DiLoCo, InnerSteps: 1, OuterLR: 1, OuterMomentum: NoMomentum}
			})
			train(t, opts, 1, func(p, _ int) { copy(opts[p].params[0].Grad.Data, grads[p]) })

			// The documented bound of every element, part by part (one
			// chunk per part: ChunkElems exceeds n).
			bound := make([]float64, n)
			for r := range peers {
				lo, hi := bounds[r], bounds[r+1]
				// What reducer r averages: its own part exactly, the
				// others' decoded.
				recon := make([]float32, hi-lo)
				for p := range peers {
					part := deltas[p][lo:hi]
					dec := part
					if p != r {
						dec = roundTrip(t, part, codec)
					}
					var cb []float32
					var scale float64
					switch codec {
					case wire.CodecQuantile8:
						cb = quantileCodebook(t, part)
					case wire.CodecUniform8:
						scale = (float64(slices.Max(part)) - float64(slices.Min(part))) / 255
					}
					for j, x := range part {
						recon[j] += dec[j] / peers
						var e float64
						switch codec {
						case wire.CodecFP16:
							e = 0x1p-11*math.Abs(float64(x)) + 0x1p-25
						case wire.CodecUniform8:
							e = scale / 2
						case wire.CodecQuantile8:
							e = halfGap(cb, x)
						}
						bound[lo+j] += e/peers + 4*eps*math.Abs(float64(x))
					}
				}
				// The mean goes back compressed once more.
				var cb []float32
				var scale float64
				switch codec {
				case wire.CodecQuantile8:
					cb = quantileCodebook(t, recon)
				case wire.CodecUniform8:
					scale = (float64(slices.Max(recon)) - float64(slices.Min(recon))) / 255
				}
				for j, m := range recon {
					switch codec {
					case wire.CodecFP16:
						bound[lo+j] += 0x1p-11*(math.Abs(float64(exact[lo+j]))+bound[lo+j]) + 0x1p-25
					case wire.CodecUniform8:
						bound[lo+j] += scale/2 + 1e-7
					case wire.CodecQuantile8:
						bound[lo+j] += halfGap(cb, m) + 1e-7 // the reducer's sum may round differently
					}
				}
			}
			for p, o := range opts {
				got := outerOf(o).pg[:n] // the averaged Δ the outer step used
				var worst, errMax float64
				for j := range n {
					e := math.Abs(float64(got[j]) - float64(exact[j]))
					errMax = max(errMax, e)
					if e > bound[j] {
						t.Fatalf("peer %d element %d: averaged Δ %v, exact mean %v: error %.3g beyond the bound %.3g",
							p, j, got[j], exact[j], e, bound[j])
					}
					worst = max(worst, e/bound[j])
				}
				if errMax == 0 {
					t.Fatalf("peer %d: no compression error at all: was the codec used?", p)
				}
				// The outer step (η = 1, no momentum) used it: θ = θ0 − Δ̄.
				snap := o.Snapshot()
				for j := range n {
					if want := theta0[j] - got[j]; snap[j] != want {
						t.Fatalf("peer %d element %d: model %v, want θ0 − Δ̄ = %v", p, j, snap[j], want)
					}
				}
				t.Logf("peer %d: largest error %.3g, at most %.2f of the bound; %d bytes sent", p, errMax, worst, o.Stats().BytesSent)
			}
		})
	}
}

// TestWADiLoCoTau1EqualsDiLoCo: with a global outer step every outer step
// and one group of all peers, WA-DiLoCo (which averages [Δ, anchor − base,
// v] in its global steps) takes DiLoCo's steps.
func TestWADiLoCoTau1EqualsDiLoCo(t *testing.T) {
	const peers, per, h, outerSteps = 3, 8, 2, 3
	const steps = h * outerSteps
	task := newBlobTask(t, peers, per, steps)
	sgd := optim.SGDConfig{LR: 0.05, Momentum: 0.9}
	run := func(cfg Config) ([][]float32, []*Optimizer) {
		models := make([]*nn.Sequential, peers)
		opts := swarm(t, peers, averaging.Config{Timeout: 10 * time.Second, ChunkElems: 100}, func(p int) (optim.Optimizer, Config) {
			models[p] = task.build()
			return optim.NewSGD(models[p].Params(), sgd), cfg
		})
		return train(t, opts, steps, func(p, s int) { task.grad(models[p], task.batch(s, p)) }), opts
	}
	want, _ := run(Config{Algo: DiLoCo, InnerSteps: h})
	got, opts := run(Config{Algo: WADiLoCo, InnerSteps: h, Tau: 1, GroupSize: peers})
	for p, o := range opts {
		if d := maxDiff(got[p], want[p]); d > 1e-5 {
			t.Errorf("peer %d: WA-DiLoCo differs from DiLoCo by %v", p, d)
		}
		if st := o.Stats(); st.OuterSteps != outerSteps || st.GlobalSyncs != outerSteps || st.GroupActive+st.GroupPassive != 0 {
			t.Errorf("peer %d: %+v", p, st)
		}
	}
}

// TestWADiLoCoGroupOuterStep: a group average in the background. Rank 0's
// partner has made no progress when rank 0, after its H inner steps,
// activates their group; both then move their anchors by the group's mean
// Δ̄ = Δ_0/2, the partner joining on receipt, without the outer learning
// rate and momentum (the defaults, 0.7 and 0.9, act only in global outer
// steps; the momentum stays zero). The outer state travels to a joiner
// with the model.
func TestWADiLoCoGroupOuterStep(t *testing.T) {
	const n, h = 500, 2
	theta0 := vecParam(n, 1, 5).Value.Data
	g := vecParam(n, 0, 6).Value.Data
	opts := swarm(t, 3, averaging.Config{Timeout: 5 * time.Second}, func(p int) (optim.Optimizer, Config) {
		w := &nn.Param{Name: "w", Value: tensor.FromSlice(slices.Clone(theta0), n), Grad: tensor.New(n)}
		return optim.NewSGD([]*nn.Param{w}, optim.SGDConfig{LR: 0.01}), Config{Algo: WADiLoCo, InnerSteps: h, Tau: 100, GroupSize: 2}
	})
	ctx := context.Background()
	// Rank 0's partner in round 1, and the third peer, which joins later.
	ranks, _, err := averaging.ButterflyGroup(0, 3, 2, 1)
	if err != nil || len(ranks) != 2 {
		t.Fatalf("round 1 group %v: %v", ranks, err)
	}
	partner := ranks[0] + ranks[1] // one of them is 0
	joiner := 3 - partner
	// The partner starts (a zero gradient: no progress).
	if err := opts[partner].Step(ctx, 1); err != nil {
		t.Fatal(err)
	}
	theta := slices.Clone(theta0)
	for range h {
		copy(opts[0].params[0].Grad.Data, g)
		if err := opts[0].Step(ctx, 1); err != nil {
			t.Fatal(err)
		}
		for j := range theta {
			theta[j] -= 0.01 * g[j]
		}
	}
	waitFor(t, 10*time.Second, "both outer steps", func() bool {
		return opts[0].Stats().OuterSteps == 1 && opts[partner].Stats().OuterSteps == 1
	})
	// A group average: the anchor moves by the mean pseudo-gradient (the
	// group's mean model), without the outer learning rate or momentum.
	want := make([]float32, n)
	for j := range want {
		want[j] = theta0[j] - (theta0[j]-theta[j])/2
	}
	for _, p := range ranks {
		if d := maxDiff(opts[p].Snapshot(), want); d > 1e-5 {
			t.Errorf("peer %d: model differs from the outer step by %v", p, d)
		}
		if d := maxDiff(opts[p].ExportState().Vector[n:2*n], want); d > 1e-5 { // "diloco/anchor" sorts first
			t.Errorf("peer %d: exported anchor differs by %v", p, d)
		}
		if d := maxDiff(outerOf(opts[p]).mom, make([]float32, n)); d != 0 {
			t.Errorf("peer %d: a group average changed the outer momentum by %v", p, d)
		}
	}
	if a, b := opts[0].Stats(), opts[partner].Stats(); a.GroupActive != 1 || b.GroupPassive != 1 || a.GlobalSyncs+b.GlobalSyncs != 0 {
		t.Errorf("%+v\n%+v", a, b)
	}
	// The third peer loads peer 0's state: model, anchor and outer momentum.
	st := opts[0].ExportState()
	if err := opts[joiner].LoadState(st); err != nil {
		t.Fatal(err)
	}
	if d := maxDiff(opts[joiner].Snapshot(), want) + maxDiff(outerOf(opts[joiner]).anchor, want) + maxDiff(outerOf(opts[joiner]).mom, outerOf(opts[0]).mom); d > 0 {
		t.Errorf("loaded outer state differs by %v", d)
	}
}

// TestWADiLoCoGlobalStepReconcilesPeers: group averages leave the peers'
// anchors different (3 peers in groups of 2: one is alone in a round); the
// global outer step every Tau outer steps, triggered by the first peer to
// arrive and joined by the others on receipt with the progress they have,
// leaves every peer with the same model, anchor, base and momentum.
func TestWADiLoCoGlobalStepReconcilesPeers(t *testing.T) {
	const peers, n, tau = 3, 400, 3
	gs := make([][]float32, peers)
	for p := range gs {
		gs[p] = vecParam(n, 0, uint64(20+p)).Value.Data
	}
	opts := swarm(t, peers, averaging.Config{Timeout: 5 * time.Second}, func(p int) (optim.Optimizer, Config) {
		w := &nn.Param{Name: "w", Value: vecParam(n, 1, 7).Value, Grad: tensor.New(n)}
		return optim.NewSGD([]*nn.Param{w}, optim.SGDConfig{LR: 0.01}), Config{Algo: WADiLoCo, InnerSteps: 1, Tau: tau, GroupSize: 2}
	})
	step := func(p, s int) {
		o := opts[p]
		o.ZeroGrad()
		for j, g := range gs[p] {
			o.params[0].Grad.Data[j] = g * float32(1+s)
		}
		if err := o.Step(context.Background(), 1); err != nil {
			t.Error(err)
		}
	}
	// Outer steps 1 and 2 average in groups (in lockstep, each waiting
	// for the background averages to end); then peer 0 alone arrives at
	// outer step 3, the global one, and the others join on receipt.
	for s := range tau - 1 {
		var wg sync.WaitGroup
		for p := range opts {
			wg.Go(func() { step(p, s) })
		}
		wg.Wait()
		waitFor(t, 10*time.Second, "group averages", func() bool {
			for _, o := range opts {
				o.mu.Lock()
				running := waOf(o).group != nil
				o.mu.Unlock()
				if running {
					return false
				}
			}
			return true
		})
	}
	if t.Failed() {
		t.FailNow()
	}
	step(0, tau-1)
	waitFor(t, 10*time.Second, "the global outer step", func() bool {
		for _, o := range opts {
			if o.Stats().GlobalSyncs != 1 {
				return false
			}
		}
		return true
	})
	var groups int
	for p, o := range opts {
		st := o.Stats()
		groups += st.GroupActive + st.GroupPassive
		if st.Round != tau {
			t.Errorf("peer %d: %+v", p, st)
		}
	}
	if groups == 0 {
		t.Fatal("no group average")
	}
	for p := 1; p < peers; p++ {
		if d := maxDiff(opts[p].Snapshot(), opts[0].Snapshot()) + maxDiff(outerOf(opts[p]).anchor, outerOf(opts[0]).anchor) +
			maxDiff(outerOf(opts[p]).mom, outerOf(opts[0]).mom) + maxDiff(waOf(opts[p]).base, outerOf(opts[0]).anchor); d > 1e-6 {
			t.Errorf("peer %d: state differs from peer 0's by %v after the global outer step", p, d)
		}
	}
}

// TestDiLoCoRefusesBadConfig: bad DiLoCo settings are refused with
// ErrConfig and a message naming the setting; zero values take defaults.
func TestDiLoCoRefusesBadConfig(t *testing.T) {
	net := memnet.NewNetwork()
	defer net.Close()
	p, err := net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	a := averaging.New(p, averaging.Config{})
	defer a.Close()
	other, err := net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	roster := []averaging.Member{{Peer: p.AddrInfo(), Weight: 1}, {Peer: other.AddrInfo(), Weight: 1}}
	mk := func(c Config) (*Optimizer, error) {
		c.Roster = roster
		return New(a, noopOpt{[]*nn.Param{vecParam(10, 0, 1)}}, c)
	}
	for _, c := range []struct {
		cfg  Config
		word string
	}{
		{Config{Algo: DiLoCo, InnerSteps: -1}, "inner steps"},
		{Config{Algo: DiLoCo, OuterLR: -0.5}, "outer learning rate"},
		{Config{Algo: WADiLoCo, OuterLR: math.NaN()}, "outer learning rate"},
		{Config{Algo: DiLoCo, OuterLR: math.Inf(1)}, "outer learning rate"},
		{Config{Algo: DiLoCo, OuterMomentum: 1}, "outer momentum"},
		{Config{Algo: DiLoCo, OuterMomentum: -0.5}, "outer momentum"},
		{Config{Algo: WADiLoCo, OuterMomentum: math.NaN()}, "outer momentum"},
		{Config{Algo: DiLoCo, InnerSteps: 10, WarmupInnerSteps: -1}, "warm-up"},
		{Config{Algo: WADiLoCo, InnerSteps: 10, WarmupInnerSteps: 11}, "warm-up"},
		{Config{Algo: DiLoCo, InnerSteps: 10, Fragments: 11}, "fragments"},
		{Config{Algo: DiLoCo, InnerSteps: 10, Fragments: -1}, "fragments"},
		{Config{Algo: WADiLoCo, InnerSteps: 10, Fragments: 2}, "fragments"},
		{Config{Algo: WAGMA, Fragments: 2}, "fragments"},
		{Config{Algo: DiLoCo, InnerSteps: 10, WarmupInnerSteps: 2, Fragments: 2}, "warm-up"},
		{Config{Algo: DiLoCo, InnerSteps: 10, OverlapSteps: 10}, "overlap"},
		{Config{Algo: DiLoCo, InnerSteps: 10, OverlapSteps: -1}, "overlap"},
	} {
		o, err := mk(c.cfg)
		if err == nil {
			o.Close()
			t.Errorf("%+v accepted", c.cfg)
			continue
		}
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.word) {
			t.Errorf("%+v: error %q, want ErrConfig naming %q", c.cfg, err, c.word)
		}
	}
	if _, err := ParseAlgo("diloco"); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseAlgo("wa-diloco"); err != nil {
		t.Fatal(err)
	}
	o, err := mk(Config{Algo: DiLoCo})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.cfg.InnerSteps != DefaultInnerSteps || outerOf(o).lr != DefaultOuterLR || outerOf(o).mu != DefaultOuterMomentum {
		t.Fatalf("defaults: H %d, η %v, μ %v", o.cfg.InnerSteps, outerOf(o).lr, outerOf(o).mu)
	}
	o2, err := mk(Config{Algo: DiLoCo, OuterMomentum: NoMomentum})
	if err != nil {
		t.Fatal(err)
	}
	defer o2.Close()
	if outerOf(o2).mu != 0 {
		t.Fatalf("NoMomentum gave μ = %v", outerOf(o2).mu)
	}
}

// TestWADiLoCoGlobalStepFromBase: after group averages have moved the
// peers' anchors apart, a global outer step takes the outer Nesterov step
// from the last global anchor (base) with the mean of base − θ, the
// progress of all Tau·H inner steps, and the mean momentum:
//
//	v' = μ·mean(v) + mean(base − θ),  θ' = base − η·(mean(base − θ) + μ·v')
//
// The peers' states are set directly, and both run the global step: the
// background one (τ > 1), whose model correction is pending until the
// next Step (Snapshot includes it), and the synchronous one (τ = 1).
func TestWADiLoCoGlobalStepFromBase(t *testing.T) {
	for _, background := range []bool{true, false} {
		t.Run(fmt.Sprintf("background=%v", background), func(t *testing.T) { testGlobalStepFromBase(t, background) })
	}
}

func testGlobalStepFromBase(t *testing.T, background bool) {
	const peers, n = 2, 300
	const eta, mu = 0.7, 0.9
	opts := swarm(t, peers, averaging.Config{Timeout: 5 * time.Second}, func(p int) (optim.Optimizer, Config) {
		w := &nn.Param{Name: "w", Value: vecParam(n, 1, 40).Value, Grad: tensor.New(n)}
		return optim.NewSGD([]*nn.Param{w}, optim.SGDConfig{LR: 0.01}), Config{Algo: WADiLoCo, InnerSteps: 1, Tau: 4, GroupSize: 2}
	})
	base := vecParam(n, 1, 41).Value.Data
	var thetas, moms [][]float32
	for p, o := range opts {
		theta := vecParam(n, 1, uint64(50+p)).Value.Data
		anchor := vecParam(n, 1, uint64(60+p)).Value.Data // moved by group averages
		mom := vecParam(n, 1, uint64(70+p)).Value.Data
		o.mu.Lock()
		copy(waOf(o).base, base)
		copy(outerOf(o).anchor, anchor)
		copy(outerOf(o).mom, mom)
		nn.SetFlatValues(o.params, theta)
		copy(o.published, theta)
		clear(o.delta)
		o.mu.Unlock()
		thetas, moms = append(thetas, theta), append(moms, mom)
	}
	want, wantMom := make([]float32, n), make([]float32, n)
	for j := range want {
		var g, v float32
		for p := range peers {
			g += (base[j] - thetas[p][j]) / peers
			v += moms[p][j] / peers
		}
		wantMom[j] = mu*v + g
		want[j] = base[j] - eta*(g+mu*wantMom[j])
	}
	errs := make([]error, peers)
	var wg sync.WaitGroup
	for p, o := range opts {
		if background {
			o.mu.Lock()
			work := waOf(o).outerGlobalLocked()
			o.mu.Unlock()
			ms := o.ranks.alive(o.ranks.allRanks())
			wg.Go(func() { work(context.Background(), averaging.Session{ID: "test/g/4", Members: ms}) })
			continue
		}
		wg.Go(func() { errs[p] = waOf(o).globalOuter(context.Background(), 4) })
	}
	wg.Wait()
	for p, o := range opts {
		if errs[p] != nil {
			t.Fatalf("peer %d: %v", p, errs[p])
		}
		if d := maxDiff(o.Snapshot(), want) + maxDiff(outerOf(o).anchor, want) + maxDiff(waOf(o).base, want); d > 1e-4 {
			t.Errorf("peer %d: model, anchor or base off the global outer step by %v", p, d)
		}
		if d := maxDiff(outerOf(o).mom, wantMom); d > 1e-4 {
			t.Errorf("peer %d: momentum off by %v", p, d)
		}
	}
}

// TestConsensusIsTheOuterModel: a DiLoCo peer's Consensus is the outer
// model (the same on every peer after an outer step) while its Snapshot
// moves on with the inner steps; for the other algorithms Consensus is
// Snapshot.
func TestConsensusIsTheOuterModel(t *testing.T) {
	const peers, per, h = 2, 8, 3
	task := newBlobTask(t, peers, per, h+1)
	sgd := optim.SGDConfig{LR: 0.1}
	models := make([]*nn.Sequential, peers)
	opts := swarm(t, peers, averaging.Config{Timeout: 10 * time.Second, ChunkElems: 100}, func(p int) (optim.Optimizer, Config) {
		models[p] = task.build()
		return optim.NewSGD(models[p].Params(), sgd), Config{Algo: DiLoCo, InnerSteps: h, OuterLR: 0.7}
	})
	grad := func(p, s int) { task.grad(models[p], task.batch(s, p)) }
	outer := train(t, opts, h, grad) // ends with the outer step: θ = anchor
	if d := maxDiff(outer[0], outer[1]); d > 1e-6 {
		t.Fatalf("peers differ by %v after the outer step", d)
	}
	inner := train(t, opts, 1, func(p, s int) { grad(p, h+s) })
	for p, o := range opts {
		if d := maxDiff(o.Consensus(), outer[0]); d != 0 {
			t.Errorf("peer %d: consensus differs from the outer model by %v after an inner step", p, d)
		}
		if d := maxDiff(inner[p], outer[0]); d == 0 {
			t.Errorf("peer %d: the inner step did not move the replica", p)
		}
	}

	plain := swarm(t, peers, averaging.Config{Timeout: 10 * time.Second, ChunkElems: 100}, func(p int) (optim.Optimizer, Config) {
		models[p] = task.build()
		return optim.NewSGD(models[p].Params(), sgd), Config{Algo: AllReduce}
	})
	got := train(t, plain, 2, grad)
	for p, o := range plain {
		if d := maxDiff(o.Consensus(), got[p]); d != 0 {
			t.Errorf("all-reduce peer %d: consensus differs from the snapshot by %v", p, d)
		}
	}
}
