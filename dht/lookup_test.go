package dht

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/peer"
)

// simNet is a static keyspace: every peer knows the k peers nearest to it
// plus a few random ones, enough to drive the pure lookup state machine.
type simNet struct {
	ids   []peer.ID
	table map[peer.ID][]peer.ID
}

func newSimNet(t *testing.T, n, k int) *simNet {
	s := &simNet{table: make(map[peer.ID][]peer.ID)}
	rng := rand.NewChaCha8([32]byte{byte(n), byte(k)})
	for i := 0; i < n; i++ {
		priv, _, err := crypto.GenerateEd25519Key(rng)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := peer.IDFromPrivateKey(priv)
		s.ids = append(s.ids, id)
	}
	// Each peer knows up to k peers per k-bucket, as a Kademlia table would.
	for _, id := range s.ids {
		self := kb.ConvertPeerID(id)
		perBucket := make(map[int]int)
		for _, other := range s.ids {
			cpl := kb.CommonPrefixLen(self, kb.ConvertPeerID(other))
			if other != id && perBucket[cpl] < k {
				perBucket[cpl]++
				s.table[id] = append(s.table[id], other)
			}
		}
	}
	return s
}

func (s *simNet) answer(p peer.ID, target kb.ID, k int) []peer.AddrInfo {
	var out []peer.AddrInfo
	for _, id := range kb.SortClosestPeers(s.table[p], target)[:k] {
		out = append(out, peer.AddrInfo{ID: id})
	}
	return out
}

func TestLookupConvergesToClosest(t *testing.T) {
	const n, k, alpha = 300, 8, 3
	s := newSimNet(t, n, k)
	_, selfID := newIdentity(t)
	target := kb.ConvertKey("some key")
	dead := map[peer.ID]bool{s.ids[1]: true}
	var alive []peer.ID
	for _, id := range s.ids {
		if !dead[id] {
			alive = append(alive, id)
		}
	}
	want := kb.SortClosestPeers(alive, target)[:k]

	l := newLookup(target, selfID, k, alpha, 100)
	for _, id := range s.ids[:3] { // a poorly connected start
		l.add(peer.AddrInfo{ID: id}, 1)
	}
	var pending []*candidate
	for steps := 0; !l.done(); steps++ {
		if steps > 1000 {
			t.Fatal("lookup did not terminate")
		}
		for {
			c, ok := l.next()
			if !ok {
				break
			}
			pending = append(pending, c)
		}
		if len(pending) > alpha {
			t.Fatalf("%d queries in flight, alpha %d", len(pending), alpha)
		}
		c := pending[0]
		pending = pending[1:]
		if dead[c.info.ID] {
			l.fail(c.info.ID)
			continue
		}
		l.succeed(c.info.ID, s.answer(c.info.ID, target, k))
	}
	got := l.closest(k)
	if len(got) != k {
		t.Fatalf("found %d peers", len(got))
	}
	for i := range want {
		if got[i].info.ID != want[i] {
			t.Fatalf("closest[%d] = %s, want %s (queries %d)", i, got[i].info.ID, want[i], l.queries)
		}
	}
	for i := 1; i < len(got); i++ {
		if bytes.Compare(got[i-1].dist, got[i].dist) >= 0 {
			t.Fatal("closest not sorted")
		}
	}
	if st := l.stats(); st.Failures != 1 || st.Hops < 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLookupBudget(t *testing.T) {
	s := newSimNet(t, 100, 8)
	_, selfID := newIdentity(t)
	l := newLookup(kb.ConvertKey("x"), selfID, 8, 2, 5)
	for _, id := range s.ids[:20] {
		l.add(peer.AddrInfo{ID: id}, 1)
	}
	for !l.done() {
		c, ok := l.next()
		if !ok {
			t.Fatal("not done but nothing to do")
		}
		l.succeed(c.info.ID, s.answer(c.info.ID, l.target, 8))
	}
	if l.queries != 5 {
		t.Fatalf("%d queries, budget 5", l.queries)
	}
	if len(l.cands) > l.maxCands+l.queries {
		t.Fatalf("%d candidates kept", len(l.cands))
	}
}
