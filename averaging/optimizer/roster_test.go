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

// TestBusyMemberDeclinesAtOnce: a member with no in-flight slot left
// declines a group round it is activated for, and tells the group: the
// activator's average ends long before ReduceWait, without the member,
// which is counted as having declined, not as a failure, and is not given
// up on.
func TestBusyMemberDeclinesAtOnce(t *testing.T) {
	const peers, n = 3, 300
	const wait = 5 * time.Second
	opts := swarm(t, peers, averaging.Config{Timeout: 2 * wait, ReduceWait: wait, ChunkElems: 64}, func(p int) (optim.Optimizer, Config) {
		w := vecParam(n, float32(p), uint64(90+p))
		return noopOpt{[]*nn.Param{w}}, Config{Algo: WAGMA, Tau: 1000, GroupSize: peers, MaxInflight: 1}
	})
	for _, o := range opts {
		o.start.Do(o.startBackground)
	}
	busy := opts[2]
	busy.ranks.inflight <- struct{}{} // its only slot is taken
	defer func() { <-busy.ranks.inflight }()
	start := time.Now()
	opts[0].ranks.startGroup(1, true)
	waitFor(t, 2*wait, "the activator's group round", func() bool {
		st := opts[0].Stats()
		return st.Collectives == 1
	})
	if el := time.Since(start); el >= wait {
		t.Fatalf("the group round took %v: the decline was not heard (ReduceWait %v)", el, wait)
	}
	waitFor(t, wait, "the other member's group round", func() bool { return opts[1].Stats().Collectives == 1 })
	for p := range 2 {
		st := opts[p].Stats()
		if st.DeclinedBy != 1 || st.Failures != 0 || st.Dead != 0 {
			t.Fatalf("peer %d: declined by %d, failures %d, dead %d; want 1, 0, 0", p, st.DeclinedBy, st.Failures, st.Dead)
		}
	}
	if st := busy.Stats(); st.GroupDeclined != 1 || st.GroupPassive != 0 {
		t.Fatalf("busy peer: %d declined, %d joined; want 1 and 0", st.GroupDeclined, st.GroupPassive)
	}
}

// TestDisagreeingMemberIsTakenBack: a member given up on that joins a
// collective with another member list is alive: it is taken back (so the
// two member lists agree again) and the collective is not a failure; one
// that declined is not given up on either.
func TestDisagreeingMemberIsTakenBack(t *testing.T) {
	opts := swarm(t, 3, averaging.Config{Timeout: 5 * time.Second}, func(p int) (optim.Optimizer, Config) {
		return noopOpt{[]*nn.Param{vecParam(10, 0, uint64(p))}}, Config{Algo: WAGMA, GroupSize: 3}
	})
	o := opts[0]
	ms := allMembers(opts)
	one, two := ms[1].Peer.ID, ms[2].Peer.ID
	o.mu.Lock()
	o.ranks.dead[one], o.ranks.seen[two] = true, true
	o.mu.Unlock()
	o.note(context.Background(), []averaging.Member{ms[0], ms[2]}, averaging.Result{Disagreed: []peer.ID{one}, Declined: []peer.ID{two}}, nil)
	st := o.Stats()
	if st.Dead != 0 || st.Revived != 1 || st.Disagreed != 1 || st.DeclinedBy != 1 || st.Failures != 0 {
		t.Fatalf("dead %d, revived %d, disagreed %d, declined by %d, failures %d; want 0, 1, 1, 1, 0", st.Dead, st.Revived, st.Disagreed, st.DeclinedBy, st.Failures)
	}
	if got := len(o.ranks.alive(o.ranks.allRanks())); got != 3 {
		t.Fatalf("%d members alive, want 3", got)
	}
}
