package optimizer

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p/memnet"
)

// A fixed roster drops a member that took part and then left at its first
// miss, but keeps one that has not started yet for a few all-reduces: a
// slow start must not leave everyone training alone.
func TestFixedRosterDropsOnlyMembersThatLeft(t *testing.T) {
	ds, err := data.GaussianBlobs(64, 8, 3, 5)
	if err != nil {
		t.Fatal(err)
	}
	net := memnet.NewNetwork()
	defer net.Close()
	const peers = 3
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
	type member struct {
		avg *averaging.Averager
		opt *Optimizer
		m   *nn.Sequential
	}
	start := func(p int) *member {
		a := averaging.New(ps[p], averaging.Config{Timeout: 5 * time.Second, ReduceWait: time.Second, ChunkElems: 64})
		m := nn.MLP([]int{8, 8, 3}, 0, rand.New(rand.NewPCG(1, 2)))
		o, err := New(a, optim.NewSGD(m.Params(), optim.SGDConfig{LR: 0.1}), Config{Algo: AllReduce, Rank: p, Roster: roster})
		if err != nil {
			t.Fatal(err)
		}
		return &member{a, o, m}
	}
	stop := func(x *member) { x.opt.Close(); x.avg.Close() }
	step := func(ms ...*member) {
		t.Helper()
		var wg sync.WaitGroup
		for _, x := range ms {
			wg.Go(func() {
				x.opt.ZeroGrad()
				b := ds.Gather([]int{0, 1, 2, 3})
				logits, st := x.m.Forward(nn.Ctx{Train: true}, b.X)
				_, d := nn.SoftmaxCrossEntropy(logits, b.Y)
				x.m.Backward(st, d)
				if err := x.opt.Step(context.Background(), 4); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	dead := func(x *member) int { return x.opt.Stats().Dead }

	// Member 2 has not started: it is kept for neverSeenMisses steps.
	m0, m1 := start(0), start(1)
	for i := 1; i < neverSeenMisses; i++ {
		step(m0, m1)
		if dead(m0) != 0 || dead(m1) != 0 {
			stop(m0)
			stop(m1)
			t.Fatalf("step %d: a member that has not started yet was dropped", i)
		}
	}
	step(m0, m1)
	if dead(m0) != 1 || dead(m1) != 1 {
		stop(m0)
		stop(m1)
		t.Fatalf("after %d misses: dead %d and %d, want 1", neverSeenMisses, dead(m0), dead(m1))
	}

	// A fresh roster where all three take part, then member 2 leaves: it
	// is dropped at the next step.
	stop(m0)
	stop(m1)
	m0, m1 = start(0), start(1)
	m2 := start(2)
	step(m0, m1, m2)
	step(m0, m1, m2)
	if dead(m0)+dead(m1)+dead(m2) != 0 {
		t.Fatal("a live member was dropped")
	}
	stop(m2)
	defer stop(m0)
	defer stop(m1)
	step(m0, m1)
	if dead(m0) != 1 || dead(m1) != 1 {
		t.Fatalf("a member that left: dead %d and %d, want 1", dead(m0), dead(m1))
	}
}
