package dht

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/p2p"
)

// TestThreeNodesOverTCP runs the DHT on real libp2p hosts over loopback TCP.
func TestThreeNodesOverTCP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var nodes []*Node
	for i := 0; i < 3; i++ {
		h, err := p2p.New(ctx, p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}})
		if err != nil {
			t.Fatal(err)
		}
		priv := h.LibP2P().Peerstore().PrivKey(h.ID())
		n, err := New(h, Config{PrivKey: priv, RPCTimeout: 5 * time.Second})
		if err != nil {
			h.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() {
			n.Close()
			h.Close()
		})
		if i > 0 {
			if err := n.Bootstrap(ctx, []peer.AddrInfo{nodes[0].t.AddrInfo()}); err != nil {
				t.Fatalf("bootstrap %d: %v", i, err)
			}
		}
		nodes = append(nodes, n)
	}
	for i, n := range nodes {
		if got := len(n.Peers()); got != 2 {
			t.Fatalf("node %d knows %d peers, want 2", i, got)
		}
	}
	exp := time.Now().Add(time.Minute)
	if k, err := nodes[1].Store(ctx, "tcp-key", "", []byte("over tcp"), exp); err != nil || k != 3 {
		t.Fatalf("store: %d replicas, %v", k, err)
	}
	owned := "profile" + OwnerMarker(nodes[2].ID())
	if _, err := nodes[2].Store(ctx, owned, "gpu", []byte("a100"), exp); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes[0].Store(ctx, owned, "gpu", []byte("fake"), exp.Add(time.Hour)); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("foreign owner store: %v", err)
	}
	for i, n := range nodes {
		got, err := n.Get(ctx, "tcp-key")
		if err != nil || string(got[""].Value) != "over tcp" {
			t.Fatalf("node %d: %+v %v", i, got, err)
		}
		got, err = n.Get(ctx, owned)
		if err != nil || string(got["gpu"].Value) != "a100" {
			t.Fatalf("node %d owned: %+v %v", i, got, err)
		}
	}
}
