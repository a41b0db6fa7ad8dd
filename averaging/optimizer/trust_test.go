package optimizer

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/averaging"
	"github.com/skyhive/skyhive/nn"
	"github.com/skyhive/skyhive/optim"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/memnet"
)

// Activations are heard only from roster members, for rounds near ours; a
// global round of 2^31−1 neither moves the counter nor starts a session.
func TestActivationsAreAuthorizedAndBounded(t *testing.T) {
	os, ps, net := twoParamPeers(t, 4)
	stranger, err := net.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	o := os[0]
	ctx := context.Background()
	call := func(from *memnet.Peer, a activation) error {
		_, err := from.Call(ctx, ps[0].AddrInfo(), ActivateProtocol, a.marshal())
		return err
	}
	refused := func(err error) bool {
		var re *p2p.RemoteError
		return errors.As(err, &re) && strings.Contains(re.Msg, ErrRefused.Error())
	}
	tau := o.cfg.Tau
	for name, tc := range map[string]struct {
		from *memnet.Peer
		a    activation
	}{
		"stranger global":      {stranger, activation{Kind: activateGlobal, Round: uint64(tau)}},
		"stranger group":       {stranger, activation{Kind: activateGroup, Round: 1}},
		"member global 2^31-1": {ps[1], activation{Kind: activateGlobal, Round: math.MaxInt32}},
		"member global beyond": {ps[1], activation{Kind: activateGlobal, Round: uint64(o.cfg.RoundWindow + tau)}},
		"member global not τ":  {ps[1], activation{Kind: activateGlobal, Round: uint64(tau + 1)}},
		"member group far":     {ps[1], activation{Kind: activateGroup, Round: math.MaxInt32}},
	} {
		if err := call(tc.from, tc.a); !refused(err) {
			t.Fatalf("%s: %v, want refused", name, err)
		}
	}
	if g := o.ranks.global.Load(); g != 0 {
		t.Fatalf("global round moved to %d", g)
	}
	if st := o.Stats(); st.Refused != 6 || st.GroupPassive != 0 {
		t.Fatalf("%+v", st)
	}
	// A member's global round at the next multiple of τ is heard.
	if err := call(ps[2], activation{Kind: activateGlobal, Round: uint64(tau)}); err != nil {
		t.Fatal(err)
	}
	if g := o.ranks.global.Load(); g != int64(tau) {
		t.Fatalf("global round %d, want %d", g, tau)
	}
}

// twoParamPeers are donors of a model with a large weight and a small bias,
// trained with momentum a few steps alike.
func twoParamPeers(t *testing.T, n int) ([]*Optimizer, []*memnet.Peer, *memnet.Network) {
	t.Helper()
	net := memnet.NewNetwork()
	t.Cleanup(func() { net.Close() })
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
	var os []*Optimizer
	for i, p := range ps {
		a := averaging.New(p, averaging.Config{})
		t.Cleanup(func() { a.Close() })
		w, b := vecParam(2000, 0, 7), vecParam(10, 0, 8)
		b.Name = "b"
		for j := range b.Value.Data {
			b.Value.Data[j] *= 0.01
		}
		sgd := optim.NewSGD([]*nn.Param{w, b}, optim.SGDConfig{LR: 0.1, Momentum: 0.9})
		o, err := New(a, sgd, Config{Algo: Local, Period: 1 << 20, Rank: i, Roster: roster})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { o.Close() })
		for s := range 3 {
			for _, q := range []*nn.Param{w, b} {
				for j := range q.Grad.Data {
					q.Grad.Data[j] = float32((j+s+i)%5) * 0.01
				}
			}
			if err := o.Step(context.Background(), 8); err != nil {
				t.Fatal(err)
			}
		}
		os = append(os, o)
	}
	return os, ps, net
}

// poison changes donor o's served state with f (under its lock).
func poison(t *testing.T, o *Optimizer, f func(v []float32, s *State)) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	st := o.exportLocked()
	s := &st
	f(s.Vector, s)
	nn.SetFlatValues(o.params, s.Vector[:o.n])
	copy(o.published, s.Vector[:o.n])
	clear(o.delta)
	if err := o.inner.LoadState(o.layout.optimState(*s)); err != nil {
		t.Fatal(err)
	}
	o.round = s.Round
}

// One lying donor among three cannot poison the joiner: a bias shifted
// far off (while the whole model stays within MaxDivergence), momentum
// scaled up, or round counters pushed ahead are each outvoted or ignored.
func TestLyingDonorCannotPoisonTheJoiner(t *testing.T) {
	for name, f := range map[string]func(v []float32, s *State){
		"bias": func(v []float32, _ *State) {
			for j := 2000; j < 2010; j++ {
				v[j] = 10
			}
		},
		"momentum": func(v []float32, _ *State) {
			for j := 2010; j < len(v); j++ {
				v[j] *= 100
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			os, ps, _ := twoParamPeers(t, 4)
			l := os[3].Layout()
			honest := os[1].ExportState()
			poison(t, os[0], f)
			bad := os[0].ExportState()
			if d := relDistance(bad.Model(l), honest.Model(l)); name == "bias" && d > 1 {
				t.Fatalf("the bias attack moves the whole model by %.3g: not the case under test", d)
			}
			d, err := Download(context.Background(), ps[3], []peer.AddrInfo{ps[0].AddrInfo(), ps[1].AddrInfo(), ps[2].AddrInfo()}, l, DownloadConfig{})
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Rejected) != 1 || d.Rejected[0] != ps[0].ID() || len(d.From) != 2 || d.Unverified {
				t.Fatalf("from %v rejected %v", d.From, d.Rejected)
			}
			// Two donors only, one lying, with MinAgree 2: a poisoned
			// model is refused; with a poisoned buffer the models are
			// used and the buffers reset to zero.
			d, err = Download(context.Background(), ps[3], []peer.AddrInfo{ps[0].AddrInfo(), ps[1].AddrInfo()}, l, DownloadConfig{MinAgree: 2})
			switch {
			case name == "bias" && err == nil:
				t.Fatal("a lying donor and an honest one accepted")
			case name == "momentum" && err != nil:
				t.Fatal(err)
			case name == "momentum" && (!d.BuffersReset || averaging.Norm(d.State.Vector[l.Params:]) != 0 || len(d.From) != 2):
				t.Fatalf("buffers reset %v, norm %g, from %v", d.BuffersReset, averaging.Norm(d.State.Vector[l.Params:]), d.From)
			}
		})
	}
	// A donor that has not stepped yet (zero momentum) and one that has:
	// honest, at the start of a run. Their models agree; the joiner takes
	// them with its buffers reset instead of failing.
	t.Run("fresh donor", func(t *testing.T) {
		os, ps, _ := twoParamPeers(t, 3)
		l := os[2].Layout()
		poison(t, os[0], func(v []float32, _ *State) { clear(v[l.Params:]) })
		d, err := Download(context.Background(), ps[2], []peer.AddrInfo{ps[0].AddrInfo(), ps[1].AddrInfo()}, l, DownloadConfig{MinAgree: 2})
		if err != nil || !d.BuffersReset || len(d.From) != 2 {
			t.Fatalf("%+v %v", d, err)
		}
	})
	t.Run("counters", func(t *testing.T) {
		os, ps, _ := twoParamPeers(t, 3)
		poison(t, os[0], func(_ []float32, s *State) { s.Round = math.MaxInt32 })
		d, err := Download(context.Background(), ps[2], []peer.AddrInfo{ps[0].AddrInfo(), ps[1].AddrInfo()}, os[2].Layout(), DownloadConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if d.State.Round != 3 {
			t.Fatalf("round %d, want the honest donor's 3", d.State.Round)
		}
	})
	t.Run("lone donor", func(t *testing.T) {
		os, ps, _ := twoParamPeers(t, 2)
		d, err := Download(context.Background(), ps[1], []peer.AddrInfo{ps[0].AddrInfo()}, os[1].Layout(), DownloadConfig{})
		if err != nil || !d.Unverified {
			t.Fatalf("%+v %v", d, err)
		}
		if _, err := Download(context.Background(), ps[1], []peer.AddrInfo{ps[0].AddrInfo()}, os[1].Layout(), DownloadConfig{MinAgree: 2}); err == nil {
			t.Fatal("a lone donor accepted with MinAgree 2")
		}
	})
}
