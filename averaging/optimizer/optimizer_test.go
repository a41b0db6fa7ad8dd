package optimizer

import (
	"bytes"
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/clock"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p/memnet"
	"github.com/skyhive/skyhive/tensor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

// noopOpt leaves the parameters alone, so only averaging changes them.
type noopOpt struct{ ps []*nn.Param }

func (noopOpt) Step()                         {}
func (noopOpt) ZeroGrad()                     {}
func (noopOpt) LR() float64                   { return 0 }
func (noopOpt) SetLR(float64)                 {}
func (o noopOpt) Params() []*nn.Param         { return o.ps }
func (noopOpt) State() optim.State            { return optim.State{} }
func (noopOpt) LoadState(s optim.State) error { return nil }

// vecParam is one parameter of n values drawn around mean.
func vecParam(n int, mean float32, seed uint64) *nn.Param {
	rng := rand.New(rand.NewPCG(seed, 9))
	v := make([]float32, n)
	for j := range v {
		v[j] = mean + float32(rng.NormFloat64())
	}
	return &nn.Param{Name: "w", Value: tensor.FromSlice(v, n), Grad: tensor.New(n)}
}

// dhtPeer is one peer of a DHT-matchmaking swarm.
type dhtPeer struct {
	peer *memnet.Peer
	node *dht.Node
	avg  *averaging.Averager
	opt  *Optimizer

	mu     sync.Mutex
	groups []GroupInfo
}

const mmElems = 3000

func newDHTPeer(t *testing.T, net *memnet.Network, seed *memnet.Peer, i int, cfg Config) *dhtPeer {
	t.Helper()
	p, err := net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	node, err := dht.New(p, dht.Config{PrivKey: p.PrivKey(), RPCTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	if seed != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := node.Bootstrap(ctx, []peer.AddrInfo{seed.AddrInfo()}); err != nil {
			t.Fatal(err)
		}
	}
	a := averaging.New(p, averaging.Config{Timeout: cfg.RoundInterval, ChunkElems: 1000})
	t.Cleanup(func() { a.Close() })
	cfg.DHT, cfg.Rank = node, i
	o, err := New(a, noopOpt{[]*nn.Param{vecParam(mmElems, float32(10*i), uint64(i))}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	dp := &dhtPeer{peer: p, node: node, avg: a, opt: o}
	o.OnGroup(func(g GroupInfo) {
		dp.mu.Lock()
		dp.groups = append(dp.groups, g)
		dp.mu.Unlock()
	})
	return dp
}

// loop steps o every 5 ms until ctx ends, as a training loop would.
func loop(ctx context.Context, o *Optimizer) error {
	for clock.Sleep(ctx, 5*time.Millisecond) == nil {
		if err := o.Step(ctx, 1); err != nil && ctx.Err() == nil {
			return err
		}
	}
	return nil
}

// spread is the largest difference between two peers' values of one parameter.
func spread(models [][]float32) float64 {
	var worst float64
	for j := range models[0] {
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, m := range models {
			lo, hi = min(lo, float64(m[j])), max(hi, float64(m[j]))
		}
		worst = max(worst, hi-lo)
	}
	return worst
}

// waitFor polls cond for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDHTMatchmakingConvergesWithJoinAndLeave(t *testing.T) {
	const n, leaver = 8, 7
	net := memnet.NewNetwork(memnet.WithLink(netem.NewNICLink(1e9, 200*time.Microsecond)))
	defer net.Close()
	cfg := Config{Matchmaking: averaging.MatchDHT, RunID: "mm-test", RoundInterval: 500 * time.Millisecond,
		MatchWindow: 150 * time.Millisecond, GroupSize: 3, GridDims: 2, Model: "vec"}
	var ps []*dhtPeer
	for i := range n {
		var seed *memnet.Peer
		if i > 0 {
			seed = ps[0].peer
		}
		ps = append(ps, newDHTPeer(t, net, seed, i, cfg))
	}
	var initial [][]float32
	for _, p := range ps {
		initial = append(initial, p.opt.Snapshot())
	}
	s0 := spread(initial)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leaveCtx, leave := context.WithCancel(ctx)
	var wg sync.WaitGroup
	run := func(p *dhtPeer, ctx context.Context) {
		wg.Go(func() {
			if err := loop(ctx, p.opt); err != nil {
				t.Error(err)
			}
		})
	}
	for i, p := range ps {
		if i == leaver {
			run(p, leaveCtx)
		} else {
			run(p, ctx)
		}
	}
	groupsOf := func(p *dhtPeer) []GroupInfo {
		p.mu.Lock()
		defer p.mu.Unlock()
		return slices.Clone(p.groups)
	}
	waitFor(t, 30*time.Second, "every peer to average in 3 groups", func() bool {
		for _, p := range ps {
			if p.opt.Stats().Groups < 3 {
				return false
			}
		}
		return true
	})

	// A late joiner finds the run through the DHT, downloads the state
	// from two donors and joins groups.
	late := newDHTPeer(t, net, ps[0].peer, n, cfg)
	own := late.opt.Snapshot()
	jctx, jcancel := context.WithTimeout(ctx, 10*time.Second)
	d, err := late.opt.Join(jctx, late.node, DownloadConfig{})
	jcancel()
	if err != nil {
		t.Fatal(err)
	}
	if len(d.From) != 2 {
		t.Fatalf("state from %d donors, want 2 (failed %v, rejected %v)", len(d.From), d.Failed, d.Rejected)
	}
	if spread([][]float32{late.opt.Snapshot(), own}) < 1 {
		t.Fatal("late joiner kept a model like its own initial one")
	}
	run(late, ctx)

	// A peer leaves: it crashes without warning.
	leave()
	if err := net.Kill(ps[leaver].peer.ID()); err != nil {
		t.Fatal(err)
	}
	leftAt := time.Now()
	gone := ps[leaver].peer.ID()
	waitFor(t, 30*time.Second, "the late joiner to average in 2 groups", func() bool {
		return late.opt.Stats().Groups >= 2
	})
	// Groups formed two rounds after the crash no longer list the leaver.
	firstClean := int(leftAt.Add(2*cfg.RoundInterval).UnixNano()/int64(cfg.RoundInterval)) + 1
	waitFor(t, 30*time.Second, "rounds after the leave", func() bool {
		gs := groupsOf(ps[0])
		return len(gs) > 0 && gs[len(gs)-1].Round >= firstClean+3
	})
	// The survivors' models converge: on a loaded machine rounds fail more
	// often and mixing takes longer, so poll (the bound stays s0/50).
	all := append(slices.Clone(ps), late)
	live := func() [][]float32 {
		var ms [][]float32
		for i, p := range all {
			if i != leaver {
				ms = append(ms, p.opt.Snapshot())
			}
		}
		return ms
	}
	deadline := time.Now().Add(20 * time.Second)
	for spread(live()) > s0/50 && time.Now().Before(deadline) {
		time.Sleep(cfg.RoundInterval)
	}
	cancel()
	wg.Wait()

	var final [][]float32
	for i, p := range all {
		if i == leaver {
			continue
		}
		for _, g := range groupsOf(p) {
			if g.Round >= firstClean && slices.Contains(g.Members, gone) {
				t.Errorf("peer %d: round %d group %v lists the peer that left", i, g.Round, g.Members)
			}
		}
		final = append(final, p.opt.Snapshot())
		t.Logf("peer %d: %+v", i, p.opt.Stats())
	}
	s1 := spread(final)
	t.Logf("spread %.4g -> %.4g", s0, s1)
	if s1 > s0/50 {
		mean := make([]float32, len(final[0]))
		for _, m := range final {
			tensor.Axpy(1/float32(len(final)), m, mean)
		}
		for i, m := range final {
			t.Logf("model %d: largest deviation from the mean %.4g", i, spread([][]float32{m, mean}))
		}
	}
	if s1 > s0/50 {
		t.Fatalf("models did not converge: spread %.4g -> %.4g", s0, s1)
	}
}

// TestCloseStopsEveryGroup checks the lifetime rule: once Close returns, no
// background group all-reduce runs or starts, however activations race
// with it. (Before, a group could pass the running check, then start after
// the worker had stopped waiting for its groups.)
func TestCloseStopsEveryGroup(t *testing.T) {
	net := memnet.NewNetwork()
	defer net.Close()
	var roster []averaging.Member
	var peers []*memnet.Peer
	for range 4 {
		p, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		peers = append(peers, p)
		roster = append(roster, averaging.Member{Peer: p.AddrInfo(), Weight: 1})
	}
	for iter := range 20 {
		a := averaging.New(peers[0], averaging.Config{Timeout: 200 * time.Millisecond})
		o, err := New(a, noopOpt{[]*nn.Param{vecParam(64, 0, 1)}}, Config{Rank: 0, Roster: roster, GroupSize: 2, MaxInflight: 64})
		if err != nil {
			t.Fatal(err)
		}
		if err := o.Step(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		var stop atomic.Bool
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for r := g; !stop.Load(); r += 4 {
					// Rank 0's partner in round r of a butterfly of 4 with S=2.
					ranks, _, _ := averaging.ButterflyGroup(0, 4, 2, r)
					from := peers[ranks[len(ranks)-1]].ID()
					_, _ = o.handleActivate(context.Background(), from, activation{Kind: activateGroup, Round: uint64(r)}.marshal())
				}
			})
		}
		time.Sleep(time.Millisecond)
		o.Close()
		// Whatever the activators do now, nothing may start.
		started := o.Stats().GroupPassive
		time.Sleep(2 * time.Millisecond)
		if after := o.Stats().GroupPassive; after != started {
			t.Fatalf("iteration %d: %d groups started after Close", iter, after-started)
		}
		stop.Store(true)
		wg.Wait()
		a.Close()
	}
}

// twoPeers returns two optimizers with SGD-with-momentum state on one
// memnet network, the first trained a few steps.
func statePeers(t *testing.T, n, maxDownloads int) ([]*Optimizer, []*memnet.Peer) {
	t.Helper()
	net := memnet.NewNetwork()
	t.Cleanup(func() { net.Close() })
	var os []*Optimizer
	var ps []*memnet.Peer
	var roster []averaging.Member
	for range n {
		p, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
		roster = append(roster, averaging.Member{Peer: p.AddrInfo(), Weight: 1})
	}
	for i, p := range ps {
		a := averaging.New(p, averaging.Config{})
		t.Cleanup(func() { a.Close() })
		w := vecParam(1000, 1, 7)
		w.Name = "w"
		sgd := optim.NewSGD([]*nn.Param{w}, optim.SGDConfig{LR: 0.1, Momentum: 0.9})
		o, err := New(a, sgd, Config{Algo: Local, Period: 1 << 20, Rank: i, Roster: roster, MaxDownloads: maxDownloads})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { o.Close() })
		os = append(os, o)
	}
	return os, ps
}

func TestJoinerDownloadsModelAndOptimizerFromTwoDonors(t *testing.T) {
	os, ps := statePeers(t, 4, 2)
	ctx := context.Background()
	// Donors 0 and 1 train with their own gradients; 3 is the joiner.
	for i := range 2 {
		w := os[i].params[0]
		for s := range 5 {
			for j := range w.Grad.Data {
				w.Grad.Data[j] = float32((j+s+i)%7) * 0.01
			}
			if err := os[i].Step(ctx, 8); err != nil {
				t.Fatal(err)
			}
		}
	}
	d, err := Download(ctx, ps[3], []peer.AddrInfo{ps[0].AddrInfo(), ps[1].AddrInfo()}, os[3].Layout(), DownloadConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.From) != 2 || d.State.OptStep != 5 || d.State.Round != 5 {
		t.Fatalf("%+v", d)
	}
	want := make([]float32, os[3].Layout().Total)
	for i := range 2 {
		os[i].mu.Lock()
		s := os[i].exportLocked()
		os[i].mu.Unlock()
		tensor.Axpy(0.5, s.Vector, want)
	}
	for j := range want {
		if math.Abs(float64(want[j]-d.State.Vector[j])) > 1e-6 {
			t.Fatalf("element %d: %v, want the donors' mean %v", j, d.State.Vector[j], want[j])
		}
	}
	if err := os[3].LoadState(d.State); err != nil {
		t.Fatal(err)
	}
	st := os[3].Inner().State()
	if st.Step != 5 || st.Tensors["w.momentum"] == nil {
		t.Fatalf("optimizer state not loaded: step %d, %d tensors", st.Step, len(st.Tensors))
	}
	if os[3].Round() != 5 {
		t.Fatalf("round %d", os[3].Round())
	}
	if err := os[3].Step(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := os[3].LoadState(d.State); err == nil {
		t.Fatal("state loaded after the first Step")
	}
}

func TestDownloadRejectsADisagreeingDonor(t *testing.T) {
	os, ps := statePeers(t, 4, 2)
	// Donor 2 serves a model far from the others'.
	w := os[2].params[0]
	for j := range w.Value.Data {
		w.Value.Data[j] = 1000 * float32(j%3)
	}
	os[2].mu.Lock()
	nn.FlatValues(os[2].params, os[2].published)
	os[2].mu.Unlock()
	d, err := Download(context.Background(), ps[3], []peer.AddrInfo{ps[2].AddrInfo(), ps[0].AddrInfo(), ps[1].AddrInfo()}, os[3].Layout(), DownloadConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Rejected) != 1 || d.Rejected[0] != ps[2].ID() || len(d.From) != 2 {
		t.Fatalf("from %v rejected %v", d.From, d.Rejected)
	}
	// With only the bad donor and one good one, there is no majority.
	if _, err := Download(context.Background(), ps[3], []peer.AddrInfo{ps[2].AddrInfo(), ps[0].AddrInfo()}, os[3].Layout(), DownloadConfig{}); err == nil {
		t.Fatal("two disagreeing donors accepted")
	}
}

func TestDownloadFailuresAreNamed(t *testing.T) {
	os, ps := statePeers(t, 3, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// A donor with another layout.
	other := os[2].Layout()
	other.Hash++
	if _, err := FetchState(ctx, ps[2], ps[0].AddrInfo(), other); err == nil {
		t.Fatal("layout mismatch accepted")
	}
	// A dead donor and a live one: the live one's state is used.
	dead, err := memnet.NewNetwork().NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	d, err := Download(ctx, ps[2], []peer.AddrInfo{dead.AddrInfo(), ps[0].AddrInfo()}, os[2].Layout(), DownloadConfig{})
	if err != nil || len(d.From) != 1 || len(d.Failed) != 1 {
		t.Fatalf("%+v %v", d, err)
	}
	// Only dead donors: an error that says so.
	_, err = Download(ctx, ps[2], []peer.AddrInfo{dead.AddrInfo()}, os[2].Layout(), DownloadConfig{})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("no donor answered")) {
		t.Fatalf("got %v", err)
	}
}

func TestDonorLimitsConcurrentDownloads(t *testing.T) {
	os, ps := statePeers(t, 3, 1)
	ctx := context.Background()
	req := stateRequest{Offset: 0, Count: 10}.marshal()
	if _, err := ps[1].Call(ctx, ps[0].AddrInfo(), StateProtocol, req); err != nil {
		t.Fatal(err)
	}
	// A second downloader while the first is unfinished is told to wait.
	_, err := ps[2].Call(ctx, ps[0].AddrInfo(), StateProtocol, req)
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte(ErrBusy.Error())) {
		t.Fatalf("second download: %v", err)
	}
	// Finishing the first frees the slot.
	if _, err := FetchState(ctx, ps[1], ps[0].AddrInfo(), os[0].Layout()); err != nil {
		t.Fatal(err)
	}
	if _, err := FetchState(ctx, ps[2], ps[0].AddrInfo(), os[0].Layout()); err != nil {
		t.Fatal(err)
	}
	// A request that does not start at 0 without a download is refused.
	if _, err := ps[2].Call(ctx, ps[0].AddrInfo(), StateProtocol, stateRequest{Offset: 10, Count: 10}.marshal()); err == nil {
		t.Fatal("mid-download request without a snapshot accepted")
	}
}

func TestAggregateEpochs(t *testing.T) {
	self := Record{Epoch: 2, Samples: 300, SamplesPerSecond: 10}
	others := []Record{{Epoch: 2, Samples: 500, SamplesPerSecond: 20}, {Epoch: 1, Samples: 9000, SamplesPerSecond: 5}}
	p := Aggregate(self, others, 1000)
	if p.Peers != 3 || p.SamplesPerSecond != 35 || p.Epoch != 2 || p.EpochSamples != 800 {
		t.Fatalf("%+v", p)
	}
	// Reaching the target advances the epoch.
	if p := Aggregate(Record{Epoch: 2, Samples: 600}, others, 1000); p.Epoch != 3 || p.EpochSamples != 0 {
		t.Fatalf("%+v", p)
	}
	// A peer far ahead drags this one at most one epoch forward.
	if p := Aggregate(Record{Epoch: 2}, []Record{{Epoch: 1 << 30, Samples: 1}}, 1000); p.Epoch != 3 {
		t.Fatalf("%+v", p)
	}
	// No target: epochs stay.
	if p := Aggregate(Record{Epoch: 0, Samples: 1 << 40}, nil, 0); p.Epoch != 0 {
		t.Fatalf("%+v", p)
	}
	var tr progressTracker
	tr.add(100)
	tr.update(Progress{Epoch: 1})
	if tr.epoch != 1 || tr.samples != 0 || tr.total != 100 {
		t.Fatalf("%+v", tr)
	}
}

func FuzzRecord(f *testing.F) {
	f.Add([]byte(`{"epoch":1,"samples":5,"samples_per_second":2.5,"round":3,"steps":4}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRecord(b)
		if err == nil && (r.Epoch < 0 || r.Samples < 0 || math.IsNaN(r.SamplesPerSecond) || r.SamplesPerSecond < 0) {
			t.Fatalf("accepted %+v", r)
		}
	})
}

func FuzzActivation(f *testing.F) {
	f.Add(activation{Kind: activateGroup, Round: 5, Hash: 9}.marshal())
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := unmarshalActivation(b)
		if err == nil && !bytes.Equal(a.marshal(), b) {
			t.Fatalf("round trip differs")
		}
	})
}

func FuzzStateMessages(f *testing.F) {
	f.Add(stateRequest{Offset: 3, Count: 100}.marshal())
	f.Add(marshalStateResponse(stateHeader{Layout: 1, Total: 2, Round: 3}, []byte("p")))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := unmarshalStateRequest(b); err == nil && !bytes.Equal(r.marshal(), b) {
			t.Fatalf("round trip differs")
		}
		if h, p, err := unmarshalStateResponse(b); err == nil && !bytes.Equal(marshalStateResponse(h, p), b) {
			t.Fatalf("round trip differs")
		}
	})
}

// TestAllReduceSGDEqualsLargeBatchSGD: P peers averaging gradients every
// step take exactly the steps of one process that trains on the union of
// their batches (mean loss), with the same SGD-with-momentum settings.
func TestAllReduceSGDEqualsLargeBatchSGD(t *testing.T) {
	const peers, per, steps = 4, 8, 6
	ds, err := data.GaussianBlobs(peers*per*steps, 20, 3, 5)
	if err != nil {
		t.Fatal(err)
	}
	build := func() *nn.Sequential { return nn.MLP([]int{20, 16, 3}, 0, rand.New(rand.NewPCG(3, 4))) }
	sgd := optim.SGDConfig{LR: 0.1, Momentum: 0.9}
	// batch(step, peer) is that peer's batch; the reference takes all peers'.
	batch := func(step, p int) []int {
		idx := make([]int, per)
		for i := range idx {
			idx[i] = (step*peers+p)*per + i
		}
		return idx
	}
	grad := func(m *nn.Sequential, idx []int) {
		b := ds.Gather(idx)
		logits, st := m.Forward(nn.Ctx{Train: true}, b.X)
		_, d := nn.SoftmaxCrossEntropy(logits, b.Y)
		m.Backward(st, d)
	}

	ref := build()
	refOpt := optim.NewSGD(ref.Params(), sgd)
	for s := range steps {
		refOpt.ZeroGrad()
		var all []int
		for p := range peers {
			all = append(all, batch(s, p)...)
		}
		grad(ref, all)
		refOpt.Step()
	}
	want := make([]float32, nn.NumParams(ref.Params()))
	nn.FlatValues(ref.Params(), want)

	net := memnet.NewNetwork()
	defer net.Close()
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
	// Every peer's handlers are registered before any peer steps (a real
	// peer waits for the others through the DHT).
	models := make([]*nn.Sequential, peers)
	opts := make([]*Optimizer, peers)
	for p := range peers {
		a := averaging.New(ps[p], averaging.Config{Timeout: 10 * time.Second, ChunkElems: 100})
		defer a.Close()
		models[p] = build()
		o, err := New(a, optim.NewSGD(models[p].Params(), sgd), Config{Algo: AllReduce, Rank: p, Roster: roster})
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		opts[p] = o
	}
	var wg sync.WaitGroup
	got := make([][]float32, peers)
	for p, o := range opts {
		wg.Go(func() {
			for s := range steps {
				o.ZeroGrad()
				grad(models[p], batch(s, p))
				if err := o.Step(context.Background(), per); err != nil {
					t.Error(err)
					return
				}
			}
			got[p] = o.Snapshot()
			if st := o.Stats(); st.Failures > 0 || st.GlobalSyncs != steps {
				t.Errorf("peer %d: %+v", p, st)
			}
		})
	}
	wg.Wait()
	for p := range peers {
		if got[p] == nil {
			continue // its error is reported
		}
		var worst float64
		for j := range want {
			worst = max(worst, math.Abs(float64(got[p][j]-want[j])))
		}
		if worst > 1e-5 {
			t.Fatalf("peer %d differs from large-batch SGD by %v", p, worst)
		}
	}
}
