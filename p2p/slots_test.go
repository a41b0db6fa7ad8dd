package p2p

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// A peer's protocol takes MaxStreamsPerPeer calls at once; the next waits
// until one is released, or fails when its context ends; another protocol
// or peer is not held up; and the table forgets keys nobody uses.
func TestStreamSlots(t *testing.T) {
	var s streamSlots
	ctx := context.Background()
	a, b := peer.ID("a"), peer.ID("b")
	var held []func()
	for range MaxStreamsPerPeer {
		r, err := s.acquire(ctx, a, "/x/1.0.0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := s.acquire(short, a, "/x/1.0.0"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call past the bound: %v, want it to wait until its deadline", err)
	}
	bounded, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	for _, other := range []slotKey{{a, "/y/1.0.0"}, {b, "/x/1.0.0"}} {
		r, err := s.acquire(bounded, other.peer, other.proto)
		if err != nil {
			t.Fatalf("%v is held up by another key's calls: %v", other, err)
		}
		r()
	}
	got := make(chan error, 1)
	go func() {
		r, err := s.acquire(ctx, a, "/x/1.0.0")
		if err == nil {
			r()
		}
		got <- err
	}()
	held[0]()
	if err := <-got; err != nil {
		t.Fatalf("a waiting call did not get the released slot: %v", err)
	}
	for _, r := range held[1:] {
		r()
	}
	s.mu.Lock()
	n := len(s.slots)
	s.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d keys left after every call ended", n)
	}
}
