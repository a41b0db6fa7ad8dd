package client

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/text"
)

// lmParagraph is the English text the DMoE LM tests train on.
const lmParagraph = `The mixture of experts is an old idea in machine learning. A gating network
looks at each input and decides which of several expert networks should handle
it, and the answer is a weighted sum of what the chosen experts say. When the
experts live on many computers, each trainer only has to send every token to a
few of them, so the model can grow far larger than any single machine could
hold. The price is that the network is slow and unreliable: a computer may go
away in the middle of a step, and the trainer must carry on with the experts
that did answer. In a language model the experts take the place of the
feed-forward layers, and every position of every sequence is routed on its
own, so that the model still reads the text from left to right.`

// lmTestSetup is a tiny DMoE LM with its experts on two servers, over
// memnet, plus the token stream of lmParagraph.
type lmTestSetup struct {
	sw     *swarm
	grids  []moe.Grid
	lm     *LM
	tokens []int32
	lr     float64
}

const lmHidden, lmSeq, lmHeads, lmK = 32, 12, 2, 2

func newLMTestSetup(t *testing.T) *lmTestSetup {
	t.Helper()
	tok, err := text.TrainBPE([]byte(lmParagraph), 300)
	if err != nil {
		t.Fatal(err)
	}
	tokens := tok.Encode([]byte(lmParagraph))
	grids := []moe.Grid{{Prefix: "lm0", Size: []int{2, 3}}, {Prefix: "lm1", Size: []int{2, 3}}}
	// Each server hosts one row of each grid, so every layer calls both.
	var a, b []string
	for _, g := range grids {
		for _, uid := range g.UIDs() {
			if strings.HasPrefix(uid, g.Prefix+".0.") {
				a = append(a, uid)
			} else {
				b = append(b, uid)
			}
		}
	}
	const lr = 3e-3
	sw := newSwarm(t, nil,
		server.Config{Experts: a, Hidden: lmHidden, Seed: 4, LR: lr},
		server.Config{Experts: b, Hidden: lmHidden, Seed: 4, LR: lr})
	cfg := LMConfig{
		Vocab: tok.VocabSize(), Seq: lmSeq, Hidden: lmHidden, Heads: lmHeads,
		Grids: grids, Layer: Config{KBest: lmK}, BeamSize: 4, CacheTTL: time.Minute, Seed: 11,
	}
	lm, err := cfg.Build(sw.tdht, sw.trainer)
	if err != nil {
		t.Fatal(err)
	}
	return &lmTestSetup{sw: sw, grids: grids, lm: lm, tokens: tokens, lr: lr}
}

// expertWeights returns the current weights of uid from whichever server
// hosts it.
func (s *lmTestSetup) expertWeights(uid string) map[string]*tensor.Tensor {
	for _, srv := range s.sw.servers {
		if w := srv.ExpertWeights(uid); w != nil {
			return w
		}
	}
	return nil
}

// refMoE is the local reference of a DMoE layer: the same gate, an
// exhaustive top-k over the whole grid (ties to the smaller coordinates),
// softmax weights over the k best, and local copies of the experts, each
// updated as its server does (one clipped AdamW step per backward batch).
type refMoE struct {
	grid    moe.Grid
	k       int
	gate    *nn.Linear
	uids    []string
	coords  [][]int
	experts []nn.Module
	opts    []*optim.AdamW
}

type refPick struct {
	e int
	p float64
}

type refMoEState struct {
	x     *tensor.Tensor
	gst   nn.State
	picks [][]refPick
	rows  [][]int       // per expert: the samples routed to it, in order
	outs  [][]float32   // per expert: its outputs for rows
	pos   []map[int]int // per expert: sample → row in rows
}

func newRefMoE(t *testing.T, s *lmTestSetup, grid moe.Grid, gate *nn.Linear) *refMoE {
	t.Helper()
	r := &refMoE{grid: grid, k: lmK, gate: nn.NewLinear(gate.In, gate.Out, 0, rand.New(rand.NewPCG(0, 0)))}
	copy(r.gate.W.Value.Data, gate.W.Value.Data)
	copy(r.gate.B.Value.Data, gate.B.Value.Data)
	for _, uid := range grid.UIDs() {
		_, c, _ := moe.SplitUID(uid)
		e := server.BuildExpert(server.TypeFFN, lmHidden, 1, rand.New(rand.NewPCG(0, 0)))
		w := s.expertWeights(uid)
		if w == nil {
			t.Fatalf("no server hosts %s", uid)
		}
		if err := nn.ImportParams(e.Params(), w); err != nil {
			t.Fatal(err)
		}
		r.uids = append(r.uids, uid)
		r.coords = append(r.coords, c)
		r.experts = append(r.experts, e)
		r.opts = append(r.opts, optim.NewAdamW(e.Params(), optim.AdamWConfig{LR: s.lr, NoDecay: optim.NoDecayVectors}))
	}
	return r
}

// forward runs the layer; fixed, if set, holds the k experts of every row
// in place of the top-k choice.
func (r *refMoE) forward(x *tensor.Tensor, fixed []int) (*tensor.Tensor, *refMoEState) {
	n, h := x.Shape[0], x.Shape[1]
	scores, gst := r.gate.Forward(nn.Ctx{}, x)
	T := r.grid.TotalSize()
	st := &refMoEState{x: x, gst: gst, picks: make([][]refPick, n),
		rows: make([][]int, len(r.uids)), outs: make([][]float32, len(r.uids)), pos: make([]map[int]int, len(r.uids))}
	for i := range n {
		type cand struct {
			e int
			s float32
		}
		cs := make([]cand, len(r.uids))
		for e, c := range r.coords {
			var s float32
			off := 0
			for d, ci := range c {
				s += scores.Data[i*T+off+ci]
				off += r.grid.Size[d]
			}
			cs[e] = cand{e, s}
		}
		all := slices.Clone(cs)
		// Row-major order and a stable sort: ties go to smaller coordinates.
		slices.SortStableFunc(cs, func(a, b cand) int { return cmpF(float64(b.s), float64(a.s)) })
		cs = cs[:r.k]
		if fixed != nil {
			for k := range cs {
				cs[k] = all[fixed[i*r.k+k]]
			}
		}
		var z float64
		for _, c := range cs {
			z += math.Exp(float64(c.s - cs[0].s))
		}
		for _, c := range cs {
			st.picks[i] = append(st.picks[i], refPick{c.e, math.Exp(float64(c.s-cs[0].s)) / z})
			if st.pos[c.e] == nil {
				st.pos[c.e] = map[int]int{}
			}
			st.pos[c.e][i] = len(st.rows[c.e])
			st.rows[c.e] = append(st.rows[c.e], i)
		}
	}
	for e, rows := range st.rows {
		if len(rows) == 0 {
			continue
		}
		xe := tensor.New(len(rows), h)
		for j, i := range rows {
			copy(xe.Data[j*h:(j+1)*h], x.Data[i*h:(i+1)*h])
		}
		o, _ := r.experts[e].Forward(nn.Ctx{}, xe)
		st.outs[e] = o.Data
	}
	y := tensor.New(n, h)
	for i, ps := range st.picks {
		for _, p := range ps {
			j := st.pos[p.e][i]
			tensor.Axpy(float32(p.p), st.outs[p.e][j*h:(j+1)*h], y.Data[i*h:(i+1)*h])
		}
	}
	return y, st
}

// backward accumulates the gate's gradient and returns the input
// gradient; with update, each expert that got rows takes its step.
func (r *refMoE) backward(st *refMoEState, dy *tensor.Tensor, update bool) *tensor.Tensor {
	n, h := st.x.Shape[0], st.x.Shape[1]
	T := r.grid.TotalSize()
	ds := tensor.New(n, T)
	douts := make([][]float32, len(r.uids))
	for e, rows := range st.rows {
		douts[e] = make([]float32, len(rows)*h)
	}
	for i, ps := range st.picks {
		dyi := dy.Data[i*h : (i+1)*h]
		dp := make([]float64, len(ps))
		var dot float64
		for k, p := range ps {
			j := st.pos[p.e][i]
			for c := range h {
				dp[k] += float64(dyi[c]) * float64(st.outs[p.e][j*h+c])
			}
			dot += p.p * dp[k]
		}
		for k, p := range ps {
			dl := float32(p.p * (dp[k] - dot))
			off := 0
			for d, ci := range r.coords[p.e] {
				ds.Data[i*T+off+ci] += dl
				off += r.grid.Size[d]
			}
			j := st.pos[p.e][i]
			tensor.Axpy(float32(p.p), dyi, douts[p.e][j*h:(j+1)*h])
		}
	}
	dx := r.gate.Backward(st.gst, ds)
	for e, rows := range st.rows {
		if len(rows) == 0 {
			continue
		}
		xe := tensor.New(len(rows), h)
		for j, i := range rows {
			copy(xe.Data[j*h:(j+1)*h], st.x.Data[i*h:(i+1)*h])
		}
		ex := r.experts[e]
		ps := ex.Params()
		nn.ZeroGrad(ps)
		_, est := ex.Forward(nn.Ctx{Train: true}, xe)
		g := ex.Backward(est, tensor.FromSlice(douts[e], len(rows), h))
		if update {
			optim.ClipGradNorm(ps, server.DefaultClipNorm)
			r.opts[e].Step()
		}
		for j, i := range rows {
			tensor.Axpy(1, g.Data[j*h:(j+1)*h], dx.Data[i*h:(i+1)*h])
		}
	}
	return dx
}

// refLM is the local reference language model: the LM's architecture
// written out with nn's layers and refMoE in place of the DMoE layers.
type refLM struct {
	embed *nn.Embedding
	pos   *nn.PositionalEmbedding
	ln1   []*nn.LayerNorm
	attn  []*nn.MultiHeadAttention
	moe   []*refMoE
	ln    *nn.LayerNorm
	head  *nn.TiedHead
	// picks lists, for the last step, the experts chosen for each token of
	// each block, in order.
	picks []int
	// frozen, if set, replaces top-k routing by these picks.
	frozen []int
}

// routing returns the experts the last step chose.
func (r *refLM) routing() []int { return slices.Clone(r.picks) }

// newRefLM copies lm's local weights and the servers' experts.
func newRefLM(t *testing.T, s *lmTestSetup) *refLM {
	t.Helper()
	rng := rand.New(rand.NewPCG(0, 0))
	c := s.lm.Config()
	r := &refLM{
		embed: nn.NewEmbedding(c.Vocab, c.Hidden, 1, rng),
		pos:   nn.NewPositionalEmbedding(c.Seq, c.Hidden, 1, rng),
		ln:    nn.NewLayerNorm(c.Hidden, 1e-5),
	}
	r.head = nn.NewTiedHead(r.embed)
	for i, b := range s.lm.Blocks {
		r.ln1 = append(r.ln1, nn.NewLayerNorm(c.Hidden, 1e-5))
		r.attn = append(r.attn, nn.NewCausalSelfAttention(c.Hidden, c.Heads, 1, rng))
		r.moe = append(r.moe, newRefMoE(t, s, s.grids[i], b.MoE.Gate))
	}
	if err := nn.ImportParams(r.params(), nn.ExportParams(s.lm.Params())); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *refLM) params() []*nn.Param {
	named := func(name string, p *nn.Param) *nn.Param {
		return &nn.Param{Name: name, Value: p.Value, Grad: p.Grad}
	}
	ps := []*nn.Param{named("embed.weight", r.embed.Table), named("pos.weight", r.pos.Table)}
	for i := range r.ln1 {
		pre := "block" + strconv.Itoa(i) + "."
		ps = append(ps, named(pre+"ln1.gamma", r.ln1[i].Gamma), named(pre+"ln1.beta", r.ln1[i].Beta))
		for _, l := range []struct {
			n string
			m *nn.Linear
		}{{"wq", r.attn[i].Wq}, {"wk", r.attn[i].Wk}, {"wv", r.attn[i].Wv}, {"wo", r.attn[i].Wo}} {
			ps = append(ps, named(pre+"attn."+l.n+".weight", l.m.W), named(pre+"attn."+l.n+".bias", l.m.B))
		}
		ps = append(ps, named(pre+"moe.gate.weight", r.moe[i].gate.W), named(pre+"moe.gate.bias", r.moe[i].gate.B))
	}
	return append(ps, named("ln.gamma", r.ln.Gamma), named("ln.beta", r.ln.Beta))
}

// step returns the loss of one batch and, with backward, accumulates the
// local gradients (and with update steps the experts).
func (r *refLM) step(x *tensor.Tensor, targets []int, backward, update bool) float32 {
	b, s := x.Shape[0], x.Shape[1]
	h := r.embed.Hidden
	e, se := r.embed.Forward(nn.Ctx{}, x)
	z, sp := r.pos.Forward(nn.Ctx{}, e)
	type blk struct {
		sl, sa nn.State
		ms     *refMoEState
	}
	bs := make([]blk, len(r.moe))
	r.picks = r.picks[:0]
	for i := range r.moe {
		n1, sl := r.ln1[i].Forward(nn.Ctx{}, z)
		a, sa := r.attn[i].Forward(nn.Ctx{}, n1)
		hh := tensor.New(b, s, h)
		tensor.Add(hh.Data, a.Data, z.Data)
		var fixed []int
		if r.frozen != nil {
			fixed = r.frozen[i*b*s*lmK : (i+1)*b*s*lmK]
		}
		y, ms := r.moe[i].forward(hh.Reshape(b*s, h), fixed)
		bs[i] = blk{sl, sa, ms}
		for _, ps := range ms.picks {
			for _, p := range ps {
				r.picks = append(r.picks, p.e)
			}
		}
		z = y.Reshape(b, s, h)
	}
	f, sf := r.ln.Forward(nn.Ctx{}, z)
	logits, sh := r.head.Forward(nn.Ctx{}, f)
	loss, dl := nn.SequenceCrossEntropy(logits, targets)
	if !backward {
		return loss
	}
	dz := r.ln.Backward(sf, r.head.Backward(sh, dl))
	for i := len(r.moe) - 1; i >= 0; i-- {
		dh := r.moe[i].backward(bs[i].ms, dz.Reshape(b*s, h), update).Reshape(b, s, h)
		dx := r.ln1[i].Backward(bs[i].sl, r.attn[i].Backward(bs[i].sa, dh))
		tensor.Add(dx.Data, dx.Data, dh.Data)
		dz = dx
	}
	r.embed.Backward(se, r.pos.Backward(sp, dz))
	return loss
}

// TestDMoELMMatchesLocalReference trains a tiny DMoE transformer LM whose
// experts run on two servers over memnet, on BPE tokens of English text,
// and checks every step's loss, every local parameter and every expert's
// weights against a local reference model that holds copies of the
// experts and does the same gating, top-k and combination in process.
// The reference's own gradient is checked by finite differences first.
func TestDMoELMMatchesLocalReference(t *testing.T) {
	s := newLMTestSetup(t)
	ref := newRefLM(t, s)
	smp, err := text.NewSampler(s.tokens, 2, lmSeq, 5)
	if err != nil {
		t.Fatal(err)
	}

	// The reference's gradient: finite differences of its loss along the
	// gradient of a few parameter tensors (experts left as they are).
	b0 := smp.Next()
	rps := ref.params()
	nn.ZeroGrad(rps)
	ref.step(b0.X, b0.Labels(), true, false)
	base := ref.routing()
	for _, p := range rps {
		switch p.Name {
		case "embed.weight", "pos.weight", "block0.attn.wq.weight", "block0.ln1.gamma", "block1.moe.gate.weight", "block1.attn.wo.weight", "ln.gamma":
		default:
			continue
		}
		g := slices.Clone(p.Grad.Data)
		norm := math.Sqrt(tensor.SumSquares(g))
		if norm == 0 {
			t.Fatalf("%s: zero gradient", p.Name)
		}
		// Top-k routing is discontinuous: the routing stays frozen to the
		// unperturbed model's (the gradient treats it as constant).
		w := slices.Clone(p.Value.Data)
		lossAt := func(h float64) float64 {
			for j := range w {
				p.Value.Data[j] = w[j] + float32(h*float64(g[j])/norm)
			}
			return float64(ref.step(b0.X, b0.Labels(), false, false))
		}
		eps := 1e-2
		if norm > 0.1 {
			eps = 1e-3 // the loss is float32: keep eps·norm well above its rounding
		}
		ref.frozen = base
		fd := (lossAt(eps) - lossAt(-eps)) / (2 * eps)
		ref.frozen = nil
		copy(p.Value.Data, w)
		// float32 losses: a few ulps over 2·eps.
		if math.Abs(fd-norm) > 0.01*norm+2*6e-7/(2*eps) {
			t.Errorf("%s: finite difference %g along the gradient, gradient norm %g", p.Name, fd, norm)
		}
	}

	opt := optim.NewAdamW(s.lm.Params(), optim.AdamWConfig{LR: s.lr, NoDecay: optim.NoDecayVectors})
	refOpt := optim.NewAdamW(rps, optim.AdamWConfig{LR: s.lr, NoDecay: optim.NoDecayVectors})
	init := map[string]map[string]*tensor.Tensor{}
	for _, g := range s.grids {
		for _, uid := range g.UIDs() {
			init[uid] = s.expertWeights(uid)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const steps = 4
	var losses []float32
	for step := range steps {
		b := b0
		if step > 0 {
			b = smp.Next()
		}
		nn.ZeroGrad(s.lm.Params())
		loss, err := s.lm.Step(ctx, b.X, b.Labels())
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		nn.ZeroGrad(rps)
		want := ref.step(b.X, b.Labels(), true, true)
		losses = append(losses, loss)
		if math.Abs(float64(loss-want)) > 1e-5*math.Max(1, math.Abs(float64(want))) {
			t.Errorf("step %d: loss %g, reference %g", step, loss, want)
		}
		// The local gradients, relative to each tensor's largest entry
		// (AdamW's first steps hardly depend on a gradient's size).
		grads := map[string]*nn.Param{}
		for _, p := range s.lm.Params() {
			grads[p.Name] = p
		}
		for _, p := range rps {
			scale := 0.0
			for _, v := range p.Grad.Data {
				scale = math.Max(scale, math.Abs(float64(v)))
			}
			if d := maxDiff(grads[p.Name].Grad.Data, p.Grad.Data); d > 2e-4*scale+1e-7 {
				t.Errorf("step %d: gradient of %s differs from the reference by %g (largest entry %g)", step, p.Name, d, scale)
			}
		}
		opt.Step()
		refOpt.Step()
		// The updated weights. A parameter whose gradient is zero but for
		// rounding (the key projections' biases, to which softmax is
		// blind) gets an AdamW step of any size up to lr from that
		// rounding, so allow a small fraction of lr.
		got := nn.ExportParams(s.lm.Params())
		for name, v := range nn.ExportParams(rps) {
			if d := maxDiff(got[name].Data, v.Data); d > 0.02*s.lr {
				t.Errorf("step %d: %s differs from the reference by %g", step, name, d)
			}
		}
		for _, r := range ref.moe {
			for e, uid := range r.uids {
				got := s.expertWeights(uid)
				for name, v := range nn.ExportParams(r.experts[e].Params()) {
					if d := maxDiff(got[name].Data, v.Data); d > 0.02*s.lr {
						t.Errorf("step %d: expert %s %s differs from the reference by %g", step, uid, name, d)
					}
				}
			}
		}
	}
	// The routing was not trivial: in every grid, several experts trained.
	for _, g := range s.grids {
		moved := 0
		for _, uid := range g.UIDs() {
			if maxDiff(s.expertWeights(uid)["ffn.fc2.bias"].Data, init[uid]["ffn.fc2.bias"].Data) > 0 {
				moved++
			}
		}
		if moved < 2 {
			t.Errorf("grid %s: only %d experts were trained", g.Prefix, moved)
		}
	}
	t.Logf("vocabulary %d, %d tokens, losses %v", s.lm.Config().Vocab, len(s.tokens), losses)
}

// TestDMoELMIsCausal checks that per-token routing keeps the model causal:
// changing the last token changes no earlier position's logits.
func TestDMoELMIsCausal(t *testing.T) {
	s := newLMTestSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	x := tensor.New(2, lmSeq)
	for i := range x.Data {
		x.Data[i] = float32(s.tokens[i])
	}
	y1, err := s.lm.Predict(ctx, x)
	if err != nil {
		t.Fatal(err)
	}
	x2 := x.Clone()
	x2.Data[lmSeq-1] = float32((int(x2.Data[lmSeq-1]) + 1) % s.lm.Config().Vocab)
	y2, err := s.lm.Predict(ctx, x2)
	if err != nil {
		t.Fatal(err)
	}
	v := s.lm.Config().Vocab
	// Up to rounding: the experts' batches hold other rows now.
	if d := maxDiff(y1.Data[:(lmSeq-1)*v], y2.Data[:(lmSeq-1)*v]); d > 1e-5 {
		t.Errorf("earlier positions of row 0 changed by %g", d)
	}
	if d := maxDiff(y1.Data[lmSeq*v:], y2.Data[lmSeq*v:]); d > 1e-5 {
		t.Errorf("row 1 changed by %g", d)
	}
	if maxDiff(y1.Data[(lmSeq-1)*v:lmSeq*v], y2.Data[(lmSeq-1)*v:lmSeq*v]) < 1e-3 {
		t.Error("the last position ignored its token")
	}
	// Bad input is refused, not a panic.
	bad := x.Clone()
	bad.Data[3] = float32(v)
	if _, err := s.lm.Predict(ctx, bad); err == nil {
		t.Error("token id outside the vocabulary accepted")
	}
	if _, err := s.lm.Predict(ctx, tensor.New(1, lmSeq+1)); err == nil {
		t.Error("sequence longer than Seq accepted")
	}
}

// TestDMoELMPassesThroughWithoutExperts checks that with AllowZeroOutputs
// a position whose experts all fail skips the feed-forward sub-block
// (y = h) instead of wiping the residual stream, forward and backward.
func TestDMoELMPassesThroughWithoutExperts(t *testing.T) {
	s := newLMTestSetup(t)
	cfg := s.lm.Config()
	cfg.Layer.AllowZeroOutputs = true
	cfg.Layer.DeadFor = -1
	lm, err := cfg.Build(s.sw.tdht, s.sw.trainer)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	x := tensor.New(2, lmSeq)
	targets := make([]int, x.Len())
	for i := range x.Data {
		x.Data[i] = float32(s.tokens[i])
		targets[i] = int(s.tokens[i+1])
	}
	// Find the experts (the beam search caches the DHT records), then
	// stop every server.
	if _, err := lm.Predict(ctx, x); err != nil {
		t.Fatal(err)
	}
	for _, srv := range s.sw.servers {
		srv.Close()
	}
	y, err := lm.Predict(ctx, x)
	if err != nil {
		t.Fatal(err)
	}
	// The same model without its feed-forward sub-blocks.
	h, _ := lm.Embed.Forward(nn.Ctx{}, x)
	h, _ = lm.Pos.Forward(nn.Ctx{}, h)
	for _, b := range lm.Blocks {
		n, _ := b.LN1.Forward(nn.Ctx{}, h)
		a, _ := b.Attn.Forward(nn.Ctx{}, n)
		tensor.Add(h.Data, h.Data, a.Data)
	}
	h, _ = lm.LN.Forward(nn.Ctx{}, h)
	want, _ := lm.Head.Forward(nn.Ctx{}, h)
	if d := maxDiff(y.Data, want.Data); d > 1e-5 {
		t.Fatalf("logits without experts differ from the attention-only model by %g", d)
	}
	nn.ZeroGrad(lm.Params())
	if _, err := lm.Step(ctx, x, targets); err != nil {
		t.Fatal(err)
	}
	for _, p := range lm.Params() {
		if p.Name == "embed.weight" || p.Name == "block0.attn.wq.weight" {
			if math.Sqrt(tensor.SumSquares(p.Grad.Data)) == 0 {
				t.Errorf("%s got no gradient through the skipped sub-blocks", p.Name)
			}
		}
	}
}

// TestDMoELMTrainsAndEvaluates trains the tiny DMoE LM with TrainLM and
// checks that its perplexity on the paragraph falls well below where it
// started.
func TestDMoELMTrainsAndEvaluates(t *testing.T) {
	s := newLMTestSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before, err := s.lm.Evaluate(ctx, s.tokens, lmSeq, 8)
	if err != nil {
		t.Fatal(err)
	}
	smp, err := text.NewSampler(s.tokens, 4, lmSeq, 9)
	if err != nil {
		t.Fatal(err)
	}
	opt := optim.NewAdamW(s.lm.Params(), optim.AdamWConfig{LR: 1e-2, NoDecay: optim.NoDecayVectors})
	var calls int64
	st, err := TrainLM(ctx, s.lm, opt, smp, LMTrainConfig{
		Steps: 60, LR: optim.Schedule{Peak: 1e-2, Min: 1e-3, Warmup: 5, Decay: optim.Cosine}, ClipNorm: 1,
		OnStep: func(int64, float64, error) { calls++ },
	})
	if err != nil || st.Failed != 0 || st.Steps != 60 || calls != 60 {
		t.Fatalf("TrainLM: %+v, %d calls: %v", st, calls, err)
	}
	after, err := s.lm.Evaluate(ctx, s.tokens, lmSeq, 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("perplexity %.1f → %.1f (last training loss %.3f)", math.Exp(before), math.Exp(after), st.LastLoss)
	if !(after < before-1) {
		t.Errorf("perplexity %.1f → %.1f: the model did not learn", math.Exp(before), math.Exp(after))
	}
	if _, err := s.lm.Evaluate(ctx, s.tokens, lmSeq+1, 8); err == nil {
		t.Error("windows longer than the model's context accepted")
	}
}
