package averaging

import (
	"fmt"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/p2p/memnet"
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
