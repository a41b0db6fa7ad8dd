package p2p

import (
	"context"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// MaxStreamsPerPeer bounds the calls a host has in flight to one peer on
// one protocol. libp2p's resource manager refuses a peer's streams past its
// per-protocol limit (64 inbound per peer and protocol by default), so a
// process that fans many calls out to one server (several MoE trainers
// sharing a host, say) would see them refused; past this bound a call
// waits for one of its own calls to finish instead, as long as its context
// allows.
const MaxStreamsPerPeer = 48

// slotKey is a peer and one of its protocols.
type slotKey struct {
	peer  peer.ID
	proto protocol.ID
}

// slot counts a key's calls in flight: sem holds one token per call.
type slot struct {
	sem   chan struct{}
	users int // calls holding or waiting for a token
}

// streamSlots bounds the calls in flight per peer and protocol. Entries
// exist only while calls use them, so the map stays as small as the set of
// peers being called.
type streamSlots struct {
	mu    sync.Mutex
	slots map[slotKey]*slot
}

// acquire waits for a free slot to the peer's protocol; release gives it
// back. It fails only when ctx ends first.
func (s *streamSlots) acquire(ctx context.Context, p peer.ID, proto protocol.ID) (release func(), err error) {
	k := slotKey{p, proto}
	s.mu.Lock()
	if s.slots == nil {
		s.slots = make(map[slotKey]*slot)
	}
	sl := s.slots[k]
	if sl == nil {
		sl = &slot{sem: make(chan struct{}, MaxStreamsPerPeer)}
		s.slots[k] = sl
	}
	sl.users++
	s.mu.Unlock()
	done := func() {
		s.mu.Lock()
		if sl.users--; sl.users == 0 {
			delete(s.slots, k)
		}
		s.mu.Unlock()
	}
	select {
	case sl.sem <- struct{}{}:
		return func() { <-sl.sem; done() }, nil
	case <-ctx.Done():
		done()
		return nil, ctx.Err()
	}
}
