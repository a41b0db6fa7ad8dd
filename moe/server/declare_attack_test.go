package server

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/client"
	"github.com/skyhive/skyhive/p2p/memnet"
)

// TestDeclarationsResistErasureAndHijack replays issue 13's attacks on the
// expert declarations: a plain value put over the grid's prefix key (the
// `skyhive dht put 'ffn.' x --ttl 700h` attack) and a later-expiring record
// that points an expert at the attacker. Both are refused, and beam search
// still finds every expert at its server. A coordinate squatted before its
// server starts is counted as a refused declaration in the server's stats.
func TestDeclarationsResistErasureAndHijack(t *testing.T) {
	n := memnet.NewNetwork()
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dcfg := dht.Config{RefreshInterval: -1, RepublishInterval: -1}
	boot, _ := n.NewPeer()
	bootDHT, err := dht.New(boot, dcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer bootDHT.Close()
	join := func() (*memnet.Peer, *dht.Node) {
		p, _ := n.NewPeer()
		d, err := dht.New(p, dcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		if err := d.Bootstrap(ctx, []peer.AddrInfo{boot.AddrInfo()}); err != nil {
			t.Fatal(err)
		}
		return p, d
	}
	serve := func(p *memnet.Peer, d *dht.Node, experts ...string) *Server {
		s, err := New(Config{Transport: p, DHT: d, Experts: experts, Hidden: 4, DeclareEvery: time.Hour, Expiration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	start := func(experts ...string) (*Server, *memnet.Peer) {
		p, d := join()
		s, err := New(Config{Transport: p, DHT: d, Experts: experts, Hidden: 4, DeclareEvery: time.Hour, Expiration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if _, err := s.Declare(ctx); err != nil {
			t.Fatal(err)
		}
		return s, p
	}
	sa, pa := start("ffn.0.0", "ffn.0.1")
	sb, pb := start("ffn.1.0")
	evilP, evil := join()
	// The next round reaches every node, the attacker's too.
	for _, s := range []*Server{sa, sb} {
		if _, err := s.Declare(ctx); err != nil {
			t.Fatal(err)
		}
	}
	far := time.Now().Add(dht.DefaultMaxTTL - time.Minute)
	// The attacker runs a DHT node, which may hold its own records if it
	// is a replica; no other node accepts them.
	if k, err := evil.Store(ctx, "ffn.", "", []byte("x"), far); k > 1 || err != nil && !errors.Is(err, dht.ErrRejected) {
		t.Fatalf("plain value over the prefix key: %d replicas, %v", k, err)
	}
	hijack, err := moe.MarshalInfo(moe.ExpertInfo{UID: "ffn.0.1", Peer: evilP.AddrInfo()})
	if err != nil {
		t.Fatal(err)
	}
	if k, err := evil.Store(ctx, "ffn.0.", "1", hijack, far); k > 1 || err != nil && !errors.Is(err, dht.ErrRejected) {
		t.Fatalf("hijacking ffn.0.1: %d replicas, %v", k, err)
	}
	// A squatted coordinate: the server declares what it can and counts
	// the refusal. Its DHT node and another server's join first, so they
	// hold the squatter's record.
	pc, dc := join()
	pq, dq := join()
	squat, err := moe.MarshalInfo(moe.ExpertInfo{UID: "ffn.2.0", Peer: evilP.AddrInfo()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := evil.Store(ctx, "ffn.2.", "0", squat, far); err != nil {
		t.Fatal(err)
	}
	sc := serve(pc, dc, "ffn.2.1")
	sq := serve(pq, dq, "ffn.2.0")
	if fails, err := sq.Declare(ctx); fails != 1 || err != nil {
		t.Fatalf("declare over a squatted coordinate: %d failed, %v", fails, err)
	}
	if st := sq.Stats(); st.DeclareRefused < 1 || st.DeclareRefused != st.DeclareFailures {
		t.Fatalf("stats after a refused declaration: refused %d, failures %d", st.DeclareRefused, st.DeclareFailures)
	}
	if _, err := sc.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	if st := sc.Stats(); st.DeclareRefused != 0 {
		t.Fatalf("honest server refused %d", st.DeclareRefused)
	}
	// Beam search from a fresh trainer finds every expert at its server.
	_, td := join()
	bs, err := client.NewBeamSearch(td, moe.Grid{Prefix: "ffn", Size: []int{3, 2}}, 4, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	scores := [][]float32{{1, 1, 1}, {1, 1}}
	got := bs.FindBest(ctx, 1, scores, 6, nil)[0]
	where := map[string]peer.ID{}
	for _, c := range got {
		where[c.Info.UID] = c.Info.Peer.ID
	}
	want := map[string]peer.ID{"ffn.0.0": pa.ID(), "ffn.0.1": pa.ID(), "ffn.1.0": pb.ID()}
	for uid, id := range want {
		if where[uid] != id {
			t.Fatalf("beam search: %s at %v, want %s (found %v)", uid, where[uid], id.ShortString(), slices.Collect(func(yield func(string) bool) {
				for u := range where {
					if !yield(u) {
						return
					}
				}
			}))
		}
	}
}
