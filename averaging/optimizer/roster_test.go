package optimizer

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

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

// A member dropped after a miss is taken back once its progress record
// shows it training on (a collective that timed out on a slow link); one
// whose record stops advancing (it died) stays dropped.
func TestDroppedMemberIsTakenBackWhenItsProgressAdvances(t *testing.T) {
	net := memnet.NewNetwork()
	defer net.Close()
	var roster []averaging.Member
	var ps []*memnet.Peer
	for range 3 {
		p, err := net.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
		roster = append(roster, averaging.Member{Peer: p.AddrInfo(), Weight: 1})
	}
	a := averaging.New(ps[0], averaging.Config{})
	defer a.Close()
	m := nn.MLP([]int{4, 2}, 0, rand.New(rand.NewPCG(1, 2)))
	o, err := New(a, optim.NewSGD(m.Params(), optim.SGDConfig{LR: 0.1}), Config{Algo: WAGMA, Rank: 0, Roster: roster, GroupSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	ctx := context.Background()
	p1, p2 := ps[1].ID(), ps[2].ID()
	alive := func() int { return len(o.alive(o.allRanks())) }
	progress := func(id peer.ID, steps int) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.observeProgressLocked(id, steps)
	}

	// Both took part once and have published 10 and 20 steps.
	o.note(ctx, roster, averaging.Result{Size: 3}, nil)
	progress(p1, 10)
	progress(p2, 20)
	// Both miss a collective: dropped.
	o.note(ctx, roster, averaging.Result{Size: 3, Failed: []peer.ID{p1}, Missing: []peer.ID{p2}}, nil)
	if s := o.Stats(); s.Dead != 2 || alive() != 1 {
		t.Fatalf("after a miss: dead %d, %d alive", s.Dead, alive())
	}
	// p1 trains on (11 steps), p2's record is unchanged (it died).
	progress(p1, 11)
	progress(p2, 20)
	if s := o.Stats(); s.Dead != 1 || s.Revived != 1 || alive() != 2 {
		t.Fatalf("after progress: dead %d, revived %d, %d alive; want 1, 1, 2", s.Dead, s.Revived, alive())
	}
	// p1 misses again: dropped again, and taken back only by new steps.
	o.note(ctx, roster[:2], averaging.Result{Size: 2, Missing: []peer.ID{p1}}, nil)
	progress(p1, 11)
	if s := o.Stats(); s.Dead != 2 || s.Revived != 1 {
		t.Fatalf("a record without new steps revived: dead %d, revived %d", s.Dead, s.Revived)
	}
	progress(p1, 12)
	if s := o.Stats(); s.Dead != 1 || s.Revived != 2 {
		t.Fatalf("dead %d, revived %d; want 1, 2", s.Dead, s.Revived)
	}
	// Taken back twice without taking part: the third time it waits four
	// reads, however many steps it shows.
	o.note(ctx, roster[:2], averaging.Result{Size: 2, Missing: []peer.ID{p1}}, nil)
	for i := range 4 {
		if s := o.Stats(); s.Dead != 2 {
			t.Fatalf("read %d: taken back before its back-off", i)
		}
		progress(p1, 100+i)
	}
	if s := o.Stats(); s.Dead != 1 || s.Revived != 3 {
		t.Fatalf("after four reads: dead %d, revived %d; want 1, 3", s.Dead, s.Revived)
	}
	// Once it takes part, the back-off starts afresh.
	o.note(ctx, roster[:2], averaging.Result{Size: 2}, nil)
	o.note(ctx, roster[:2], averaging.Result{Size: 2, Missing: []peer.ID{p1}}, nil)
	progress(p1, 200)
	if s := o.Stats(); s.Dead != 1 || s.Revived != 4 {
		t.Fatalf("after taking part: dead %d, revived %d; want 1, 4", s.Dead, s.Revived)
	}
}
