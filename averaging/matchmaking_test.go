package averaging

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p/memnet"
	"github.com/skyhive/skyhive/tensor"
)

func TestGroupKey(t *testing.T) {
	coords := []int{2, 0, 1}
	if got, want := GroupKey("r", 4, coords), "r/mm/4/2/*/1"; got != want {
		t.Fatalf("GroupKey = %q, want %q", got, want)
	}
	// Peers that differ only in the round's dimension meet.
	if GroupKey("r", 3, []int{0, 5, 6}) != GroupKey("r", 3, []int{1, 5, 6}) {
		t.Fatal("peers differing in dimension 0 do not meet in round 3")
	}
	if GroupKey("r", 3, []int{0, 5, 6}) == GroupKey("r", 3, []int{0, 4, 6}) {
		t.Fatal("peers differing in dimension 1 meet in round 3")
	}
}

func TestSplitGroup(t *testing.T) {
	for n := 1; n <= 20; n++ {
		for size := 1; size <= 6; size++ {
			ids := make([]peer.ID, n)
			for i := range ids {
				ids[i] = peer.ID(fmt.Sprintf("p%02d", i))
			}
			seen := map[peer.ID]int{}
			k := (n + size - 1) / size
			groups := map[string]bool{}
			for _, self := range ids {
				g, idx := SplitGroup(ids, self, size)
				if idx < 0 || idx >= len(g) || g[idx] != self || len(g) > size || len(g) < n/k {
					t.Fatalf("n=%d size=%d self=%s: group %v index %d", n, size, self, g, idx)
				}
				seen[self]++
				groups[fmt.Sprint(g)] = true
			}
			if len(groups) != k {
				t.Fatalf("n=%d size=%d: %d groups, want %d", n, size, len(groups), k)
			}
		}
	}
	if _, idx := SplitGroup([]peer.ID{"a", "b"}, "c", 2); idx != -1 {
		t.Fatal("non-member found")
	}
}

func TestParseDeclaration(t *testing.T) {
	net := memnet.NewNetwork()
	defer net.Close()
	p, err := net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	b, err := declaration{Addr: p.AddrInfo(), Round: 3}.marshal()
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDeclaration(p.ID().String(), b)
	if err != nil || d.Addr.ID != p.ID() || d.Round != 3 {
		t.Fatalf("%+v %v", d, err)
	}
	q, _ := net.NewPeer()
	if _, err := parseDeclaration(q.ID().String(), b); err == nil {
		t.Fatal("declaration under another peer's subkey accepted")
	}
	if _, err := parseDeclaration(p.ID().String(), []byte(`{"addr":`)); err == nil {
		t.Fatal("truncated declaration accepted")
	}
}

func FuzzDeclaration(f *testing.F) {
	net := memnet.NewNetwork()
	defer net.Close()
	p, _ := net.NewPeer()
	b, _ := declaration{Addr: p.AddrInfo(), Round: 3}.marshal()
	f.Add(p.ID().String(), b)
	f.Add("x", []byte(`{"round":-1}`))
	f.Fuzz(func(t *testing.T, sub string, b []byte) {
		d, err := parseDeclaration(sub, b)
		if err != nil {
			return
		}
		if d.Addr.ID.String() != sub || d.Round < 0 || len(d.Addr.Addrs) > maxDeclAddrs {
			t.Fatalf("accepted %+v under %q", d, sub)
		}
	})
}

// noopOpt leaves the parameters alone, so only averaging changes them.
type noopOpt struct{}

func (noopOpt) Step()                       {}
func (noopOpt) ZeroGrad()                   {}
func (noopOpt) LR() float64                 { return 0 }
func (noopOpt) SetLR(float64)               {}
func (noopOpt) Params() []*nn.Param         { return nil }
func (noopOpt) State() optim.State          { return optim.State{} }
func (noopOpt) LoadState(optim.State) error { return nil }

// dhtPeer is one peer of a DHT-matchmaking swarm.
type dhtPeer struct {
	peer   *memnet.Peer
	node   *dht.Node
	avg    *Averager
	param  *nn.Param
	worker *Worker

	mu     sync.Mutex
	groups []GroupInfo
}

const mmElems = 3000

func newDHTPeer(t *testing.T, net *memnet.Network, seed *memnet.Peer, i int, wc WorkerConfig) *dhtPeer {
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
	a := New(p, Config{Timeout: wc.RoundInterval, ChunkElems: 1000})
	t.Cleanup(func() { a.Close() })
	rng := rand.New(rand.NewPCG(uint64(i), 9))
	v := make([]float32, mmElems)
	for j := range v {
		v[j] = float32(10*i) + float32(rng.NormFloat64())
	}
	param := &nn.Param{Name: "w", Value: tensor.FromSlice(v, mmElems), Grad: tensor.New(mmElems)}
	compute := func(ctx context.Context, step int) (float64, error) {
		return 0, sleep(ctx, 5*time.Millisecond)
	}
	wc.DHT, wc.Rank = node, i
	w, err := NewWorker(a, []*nn.Param{param}, noopOpt{}, compute, wc)
	if err != nil {
		t.Fatal(err)
	}
	dp := &dhtPeer{peer: p, node: node, avg: a, param: param, worker: w}
	w.OnGroup(func(g GroupInfo) {
		dp.mu.Lock()
		dp.groups = append(dp.groups, g)
		dp.mu.Unlock()
	})
	return dp
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

func TestDHTMatchmakingConvergesWithJoinAndLeave(t *testing.T) {
	const n, leaver = 8, 7
	net := memnet.NewNetwork(memnet.WithLink(NewNICLink(1e9, 200*time.Microsecond)))
	defer net.Close()
	wc := WorkerConfig{Matchmaking: MatchDHT, RunID: "mm-test", RoundInterval: 500 * time.Millisecond,
		MatchWindow: 150 * time.Millisecond, GroupSize: 3, GridDims: 2}
	var ps []*dhtPeer
	for i := range n {
		var seed *memnet.Peer
		if i > 0 {
			seed = ps[0].peer
		}
		ps = append(ps, newDHTPeer(t, net, seed, i, wc))
	}
	var initial [][]float32
	for _, p := range ps {
		initial = append(initial, p.worker.Snapshot())
	}
	s0 := spread(initial)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leaveCtx, leave := context.WithCancel(ctx)
	var wg sync.WaitGroup
	run := func(p *dhtPeer, ctx context.Context) {
		wg.Go(func() {
			if _, err := p.worker.Run(ctx); err != nil {
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
	// waitFor polls cond for up to d.
	waitFor := func(d time.Duration, what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(d); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	groupsOf := func(p *dhtPeer) []GroupInfo {
		p.mu.Lock()
		defer p.mu.Unlock()
		return slices.Clone(p.groups)
	}
	// Every peer averages in groups (several rounds each).
	waitFor(30*time.Second, "every peer to average in 3 groups", func() bool {
		for _, p := range ps {
			if p.worker.Stats().Groups < 3 {
				return false
			}
		}
		return true
	})

	// A late joiner finds the run through the DHT, fetches the model and
	// joins groups.
	late := newDHTPeer(t, net, ps[0].peer, n, wc)
	own := late.worker.Snapshot()
	jctx, jcancel := context.WithTimeout(ctx, 10*time.Second)
	vec, round, err := JoinState(jctx, late.node, late.peer, wc.RunID, mmElems)
	jcancel()
	if err != nil {
		t.Fatal(err)
	}
	if spread([][]float32{vec, own}) < 1 {
		t.Fatal("late joiner fetched a model like its own initial one")
	}
	if err := late.worker.LoadState(vec, round); err != nil {
		t.Fatal(err)
	}
	run(late, ctx)

	// A peer leaves: it crashes without warning.
	leave()
	if err := net.Kill(ps[leaver].peer.ID()); err != nil {
		t.Fatal(err)
	}
	leftAt := time.Now()
	gone := ps[leaver].peer.ID()
	waitFor(30*time.Second, "the late joiner to average in 2 groups", func() bool {
		return late.worker.Stats().Groups >= 2
	})
	// Groups formed two rounds after the crash no longer list the leaver.
	firstClean := int(leftAt.Add(2*wc.RoundInterval).UnixNano()/int64(wc.RoundInterval)) + 1
	waitFor(30*time.Second, "rounds after the leave", func() bool {
		gs := groupsOf(ps[0])
		return len(gs) > 0 && gs[len(gs)-1].Round >= firstClean+3
	})
	cancel()
	wg.Wait()

	for i, p := range append(ps, late) {
		if i == leaver {
			continue
		}
		for _, g := range groupsOf(p) {
			if g.Round >= firstClean && slices.Contains(g.Members, gone) {
				t.Errorf("peer %d: round %d group %v lists the peer that left", i, g.Round, g.Members)
			}
		}
	}
	var final [][]float32
	for i, p := range append(ps, late) {
		if i != leaver {
			final = append(final, p.worker.Snapshot())
		}
	}
	s1 := spread(final)
	for i, p := range append(ps, late) {
		t.Logf("peer %d: %+v", i, p.worker.Stats())
	}
	t.Logf("spread %.4g -> %.4g", s0, s1)
	if s1 > s0/50 {
		t.Fatalf("models did not converge: spread %.4g -> %.4g", s0, s1)
	}
	if late.worker.Stats().Groups < 2 {
		t.Fatalf("late joiner: %+v", late.worker.Stats())
	}
}
