package client

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/memnet"
	"github.com/skyhive/skyhive/tensor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

func randTensor(seed uint64, shape ...int) *tensor.Tensor {
	t := tensor.New(shape...)
	tensor.FillNormal(t.Data, rand.New(rand.NewPCG(seed, 1)), 0, 1)
	return t
}

func maxDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// swarm is a memnet network with a bootstrap DHT node, expert servers and
// one trainer peer with its own DHT node.
type swarm struct {
	net     *memnet.Network
	bootP   *memnet.Peer
	boot    *dht.Node
	servers []*server.Server
	peers   []*memnet.Peer
	trainer *memnet.Peer
	tdht    *dht.Node
}

func newSwarm(t *testing.T, opts []memnet.Option, cfgs ...server.Config) *swarm {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := &swarm{net: memnet.NewNetwork(opts...)}
	t.Cleanup(func() { s.net.Close() })
	dcfg := dht.Config{RefreshInterval: -1, RepublishInterval: -1}
	bp, _ := s.net.NewPeer()
	s.bootP = bp
	var err error
	s.boot, err = dht.New(bp, dcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.boot.Close() })
	join := func() (*memnet.Peer, *dht.Node) {
		p, _ := s.net.NewPeer()
		d, err := dht.New(p, dcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		if err := d.Bootstrap(ctx, []peer.AddrInfo{bp.AddrInfo()}); err != nil {
			t.Fatal(err)
		}
		return p, d
	}
	for _, cfg := range cfgs {
		p, d := join()
		cfg.Transport, cfg.DHT = p, d
		cfg.DeclareEvery = time.Hour
		srv, err := server.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		if _, err := srv.Declare(ctx); err != nil {
			t.Fatal(err)
		}
		s.servers = append(s.servers, srv)
		s.peers = append(s.peers, p)
	}
	s.trainer, s.tdht = join()
	return s
}

// TestMatchesLocalReference checks that a MixtureOfExperts whose experts
// all answer computes the same output, input gradient, gating gradient
// and expert updates as a straightforward local implementation.
func TestMatchesLocalReference(t *testing.T) {
	const hidden, n, k = 8, 5, 3
	grid := moe.Grid{Prefix: "ffn", Size: []int{2, 3}}
	lr := 0.01
	sw := newSwarm(t, nil, server.Config{Experts: grid.UIDs(), Hidden: hidden, Seed: 4, LR: lr})
	bs, err := NewBeamSearch(sw.tdht, grid, 4, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{In: hidden, Search: bs, Transport: sw.trainer, KBest: k, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	// Local copies of the experts with the server's initial weights.
	local := map[string]nn.Module{}
	opts := map[string]*optim.AdamW{}
	for _, uid := range grid.UIDs() {
		e := server.BuildExpert(server.TypeFFN, hidden, 1, rand.New(rand.NewPCG(0, 0)))
		if err := nn.ImportParams(e.Params(), sw.servers[0].ExpertWeights(uid)); err != nil {
			t.Fatal(err)
		}
		local[uid] = e
		opts[uid] = optim.NewAdamW(e.Params(), optim.AdamWConfig{LR: lr, NoDecay: optim.NoDecayVectors})
	}
	x := randTensor(1, n, hidden)
	dy := randTensor(2, n, hidden)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	y, st, err := m.ForwardCtx(ctx, x)
	if err != nil {
		t.Fatal(err)
	}
	if got := Answered(st); !slices.Equal(got, []int{k, k, k, k, k}) {
		t.Fatalf("answered %v", got)
	}
	nn.ZeroGrad(m.Params())
	dx, err := m.BackwardCtx(ctx, st, dy)
	if err != nil {
		t.Fatal(err)
	}

	// Reference, one sample at a time over the whole grid.
	W, B := m.Gate.W.Value.Data, m.Gate.B.Value.Data
	T := grid.TotalSize()
	yRef := tensor.New(n, hidden)
	dxRef := tensor.New(n, hidden)
	dW := make([]float64, hidden*T)
	type acc struct{ x, dy []float32 }
	expertIn := map[string]*acc{}
	for i := range n {
		xi := x.Data[i*hidden : (i+1)*hidden]
		s := make([]float64, T)
		for o := range T {
			s[o] = float64(B[o])
			for h := range hidden {
				s[o] += float64(xi[h]) * float64(W[h*T+o])
			}
		}
		type cand struct {
			uid    string
			c0, c1 int
			l      float64
		}
		var cs []cand
		for a := range 2 {
			for b := range 3 {
				cs = append(cs, cand{moe.JoinUID("ffn", []int{a, b}), a, b, s[a] + s[2+b]})
			}
		}
		slices.SortFunc(cs, func(p, q cand) int { return -cmpF(p.l, q.l) })
		cs = cs[:k]
		p := make([]float64, k)
		outs := make([][]float32, k)
		var z float64
		for j, c := range cs {
			p[j] = math.Exp(c.l - cs[0].l)
			z += p[j]
		}
		dyi := dy.Data[i*hidden : (i+1)*hidden]
		dp := make([]float64, k)
		var dot float64
		for j, c := range cs {
			p[j] /= z
			o, _ := local[c.uid].Forward(nn.Ctx{}, tensor.FromSlice(slices.Clone(xi), 1, hidden))
			outs[j] = o.Data
			for h := range hidden {
				yRef.Data[i*hidden+h] += float32(p[j]) * o.Data[h]
				dp[j] += float64(dyi[h]) * float64(o.Data[h])
			}
			dot += p[j] * dp[j]
		}
		ds := make([]float64, T)
		for j, c := range cs {
			dl := p[j] * (dp[j] - dot)
			ds[c.c0] += dl
			ds[2+c.c1] += dl
			a := expertIn[c.uid]
			if a == nil {
				a = &acc{}
				expertIn[c.uid] = a
			}
			a.x = append(a.x, xi...)
			for h := range hidden {
				a.dy = append(a.dy, float32(p[j])*dyi[h])
			}
		}
		for h := range hidden {
			var g float64
			for o := range T {
				g += float64(W[h*T+o]) * ds[o]
				dW[h*T+o] += float64(xi[h]) * ds[o]
			}
			dxRef.Data[i*hidden+h] = float32(g)
		}
	}
	// Expert input gradients and updates: one backward batch per expert.
	for uid, a := range expertIn {
		rows := len(a.x) / hidden
		e := local[uid]
		xs := tensor.FromSlice(a.x, rows, hidden)
		opts[uid].ZeroGrad()
		_, est := e.Forward(nn.Ctx{Train: true}, xs)
		g := e.Backward(est, tensor.FromSlice(a.dy, rows, hidden))
		opts[uid].Step()
		// Scatter back in sample order: rows were appended per sample.
		r := 0
		for i := range n {
			for _, c := range st.(*moeState).choices[i] {
				if c.call.expert.UID == uid {
					tensor.Axpy(1, g.Data[r*hidden:(r+1)*hidden], dxRef.Data[i*hidden:(i+1)*hidden])
					r++
				}
			}
		}
	}
	if d := maxDiff(y.Data, yRef.Data); d > 1e-5 {
		t.Errorf("output differs from reference by %g", d)
	}
	if d := maxDiff(dx.Data, dxRef.Data); d > 1e-4 {
		t.Errorf("input gradient differs from reference by %g", d)
	}
	dW32 := make([]float32, len(dW))
	for i, v := range dW {
		dW32[i] = float32(v)
	}
	if d := maxDiff(m.Gate.W.Grad.Data, dW32); d > 1e-4 {
		t.Errorf("gate gradient differs from reference by %g", d)
	}
	for uid, e := range local {
		want := nn.ExportParams(e.Params())
		got := sw.servers[0].ExpertWeights(uid)
		for name := range want {
			if d := maxDiff(got[name].Data, want[name].Data); d > 1e-5 {
				t.Errorf("expert %s %s differs from the reference update by %g", uid, name, d)
			}
		}
	}

	// The reference's formula itself: finite differences of L = Σ dy·y
	// with respect to one input coordinate.
	const eps = 1e-2
	for _, idx := range []int{0, 13, 39} {
		xp, xm := x.Clone(), x.Clone()
		xp.Data[idx] += eps
		xm.Data[idx] -= eps
		lp := dotLoss(t, m, xp, dy)
		lm := dotLoss(t, m, xm, dy)
		fd := (lp - lm) / (2 * eps)
		// The experts moved by one step since; compare loosely.
		if math.Abs(fd-float64(dxRef.Data[idx])) > 0.05*math.Max(1, math.Abs(fd)) {
			t.Errorf("finite difference %g vs reference gradient %g at %d", fd, dxRef.Data[idx], idx)
		}
	}
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func dotLoss(t *testing.T, m *MixtureOfExperts, x, dy *tensor.Tensor) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	y, _, err := m.ForwardCtx(ctx, x)
	if err != nil {
		t.Fatal(err)
	}
	var l float64
	for i := range y.Data {
		l += float64(y.Data[i]) * float64(dy.Data[i])
	}
	return l
}

// delayAll makes every message of the swarm take d.
func (s *swarm) delayAll(t *testing.T, d time.Duration) {
	link, err := netem.Delay(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append([]*memnet.Peer{s.bootP, s.trainer}, s.peers...) {
		if err := link.Assign(p.ID(), netem.UniformRegion); err != nil {
			t.Fatal(err)
		}
	}
	s.net.SetLink(link)
}

// A server killed in the middle of a forward call: the step completes with
// the experts of the other server, and the next step avoids the dead one.
func TestServerKilledMidRequest(t *testing.T) {
	grid := moe.Grid{Prefix: "ffn", Size: []int{2, 2}}
	sw := newSwarm(t, []memnet.Option{memnet.WithBlackhole()},
		server.Config{Experts: []string{"ffn.0.0", "ffn.0.1"}, Hidden: 8},
		server.Config{Experts: []string{"ffn.1.0", "ffn.1.1"}, Hidden: 8})
	bs, _ := NewBeamSearch(sw.tdht, grid, 4, time.Minute)
	m, err := New(Config{In: 8, Search: bs, Transport: sw.trainer, KBest: 4, KMin: 1,
		TimeoutAfterKMin: time.Second, ForwardTimeout: 5 * time.Second, BackwardTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	x := randTensor(1, 6, 8)
	// Warm the beam search's cache: the dead server is a DHT node too.
	if _, _, err := m.ForwardCtx(ctx, x); err != nil {
		t.Fatal(err)
	}
	sw.delayAll(t, 100*time.Millisecond)
	time.AfterFunc(50*time.Millisecond, func() { sw.net.Kill(sw.peers[1].ID()) })
	t0 := time.Now()
	y, st, err := m.ForwardCtx(ctx, x)
	if err != nil {
		t.Fatalf("forward with a dead server: %v", err)
	}
	if el := time.Since(t0); el > 3*time.Second {
		t.Fatalf("forward took %v despite TimeoutAfterKMin", el)
	}
	for i, a := range Answered(st) {
		if a != 2 {
			t.Fatalf("sample %d: %d experts answered, want the 2 live ones", i, a)
		}
	}
	if _, err := m.BackwardCtx(ctx, st, randTensor(2, 6, 8)); err != nil {
		t.Fatalf("backward: %v", err)
	}
	if y.Len() != x.Len() {
		t.Fatal("bad output")
	}
	// The dead experts are skipped now: no waiting for them.
	t0 = time.Now()
	if _, st, err = m.ForwardCtx(ctx, x); err != nil || Answered(st)[0] != 2 {
		t.Fatalf("second forward: %v", err)
	}
	if el := time.Since(t0); el > 700*time.Millisecond {
		t.Fatalf("second forward waited %v for dead experts", el)
	}
}

// A server-side error reaches the caller with the expert's name.
func TestServerErrorNamesExpert(t *testing.T) {
	sw := newSwarm(t, nil, server.Config{Experts: []string{"ffn.0"}, Hidden: 8})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := &RemoteExpert{UID: "ffn.0", Peer: sw.peers[0].AddrInfo(), Transport: sw.trainer}
	_, _, err := r.Forward(ctx, randTensor(1, 2, 5)) // wrong hidden size
	var re *p2p.RemoteError
	var ee *ExpertError
	if !errors.As(err, &re) || !errors.As(err, &ee) || ee.UID != "ffn.0" || !strings.Contains(err.Error(), "ffn.0") || !strings.Contains(re.Msg, "shape") {
		t.Fatalf("got %v", err)
	}
	spec, err := r.Info(ctx)
	if err != nil || spec.Hidden != 8 || spec.Type != "ffn" {
		t.Fatalf("info %+v %v", spec, err)
	}
	// A layer whose every expert fails reports the experts' errors.
	bs, _ := NewBeamSearch(sw.tdht, moe.Grid{Prefix: "ffn", Size: []int{1}}, 2, time.Minute)
	m, _ := New(Config{In: 8, Search: bs, Transport: sw.trainer, KBest: 1})
	sw.servers[0].Close()
	_, _, err = m.ForwardCtx(ctx, randTensor(1, 2, 8))
	if !errors.Is(err, ErrNoExperts) || !strings.Contains(err.Error(), "ffn.0") {
		t.Fatalf("all experts failing: %v", err)
	}
}

func TestBeamSearchPicksTopScores(t *testing.T) {
	grid := moe.Grid{Prefix: "g", Size: []int{3, 4}}
	// Host all but g.2.3 so the search must skip a missing expert.
	var uids []string
	for _, u := range grid.UIDs() {
		if u != "g.2.3" {
			uids = append(uids, u)
		}
	}
	sw := newSwarm(t, nil, server.Config{Experts: uids, Hidden: 4, Lazy: true, DeclareParallel: 1})
	bs, _ := NewBeamSearch(sw.tdht, grid, 3, time.Minute)
	s0 := []float32{0, 1, 5 /* sample 1 */, 3, 2, 1}
	s1 := []float32{0, 0, 1, 9 /* sample 1 */, 4, 0, 0, 1}
	got := bs.FindBest(context.Background(), 2, [][]float32{s0, s1}, 3, nil)
	want := [][]string{{"g.1.3", "g.0.3", "g.2.2"}, {"g.0.0", "g.1.0", "g.2.0"}}
	for i := range want {
		var uids []string
		for _, c := range got[i] {
			uids = append(uids, c.Info.UID)
		}
		if !slices.Equal(uids, want[i]) {
			t.Errorf("sample %d: got %v, want %v", i, uids, want[i])
		}
	}
	// Ties go to the smaller coordinates, and skipped experts are left out.
	zeros := [][]float32{make([]float32, 3), make([]float32, 4)}
	skip := func(uid string) bool { return uid == "g.0.1" }
	for range 3 {
		var uids []string
		for _, c := range bs.FindBest(context.Background(), 1, zeros, 3, skip)[0] {
			uids = append(uids, c.Info.UID)
		}
		if want := []string{"g.0.0", "g.0.2", "g.0.3"}; !slices.Equal(uids, want) {
			t.Fatalf("equal scores: got %v, want %v", uids, want)
		}
	}
}

// TestDeclared checks that a trainer learns the type and hidden size of a
// grid's experts from their DHT records, and finds none for a grid no
// server hosts.
func TestDeclared(t *testing.T) {
	grid := moe.Grid{Prefix: "ffn", Size: []int{2, 2}}
	sw := newSwarm(t, nil, server.Config{Experts: grid.UIDs(), Hidden: 24, Seed: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	infos, err := Declared(ctx, sw.tdht, grid)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 {
		t.Fatalf("%d records under ffn., want one per first coordinate (2): %+v", len(infos), infos)
	}
	for _, e := range infos {
		if e.Type != server.TypeFFN || e.Hidden != 24 || e.Peer.ID != sw.peers[0].ID() {
			t.Errorf("record %+v, want an ffn expert of hidden 24 on %s", e, sw.peers[0].ID())
		}
	}
	none, err := Declared(ctx, sw.tdht, moe.Grid{Prefix: "att", Size: []int{2}})
	if err != nil || len(none) != 0 {
		t.Fatalf("grid without servers: %+v, %v", none, err)
	}
}

// TestFailedCallsSummarised checks that a pass whose many expert calls fail
// alike reports the count and the first error once, not every call's
// message, while errors.As still reaches each call's error.
func TestFailedCallsSummarised(t *testing.T) {
	grid := moe.Grid{Prefix: "ffn", Size: []int{4, 4}}
	// Experts of hidden 16 called by a layer of hidden 8: every call fails.
	sw := newSwarm(t, nil, server.Config{Experts: grid.UIDs(), Hidden: 16})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bs, _ := NewBeamSearch(sw.tdht, grid, 4, time.Minute)
	m, _ := New(Config{In: 8, Search: bs, Transport: sw.trainer, KBest: 4, Seed: 3})
	_, _, err := m.ForwardCtx(ctx, randTensor(1, 16, 8))
	var ee *ExpertError
	if !errors.Is(err, ErrNoExperts) || !errors.As(err, &ee) {
		t.Fatalf("every call failing: %v", err)
	}
	msg := err.Error()
	if n := strings.Count(msg, "wants [batch, hidden]"); n != 1 {
		t.Fatalf("the cause appears %d times, want once: %s", n, msg)
	}
	if !strings.Contains(msg, "expert calls failed, the first: ") {
		t.Fatalf("no count of the failed calls: %s", msg)
	}
}
