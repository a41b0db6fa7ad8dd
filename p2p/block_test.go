package p2p

import (
	"context"
	"crypto/rand"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// A blocked peer's calls are not served: over TCP they wait unread until
// the block ends, over QUIC the first is refused with the reason and later
// ones are reset; others are served; the block ends.
func TestBlock(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a := newHost(t, tr, Config{})
			b := newHost(t, tr, Config{})
			c := newHost(t, tr, Config{})
			var runs atomic.Int64
			a.SetHandler(echoProto, countingEcho(&runs))
			ctx := ctxT(t, 40*time.Second)
			if _, err := b.Call(ctx, a.AddrInfo(), echoProto, []byte("x")); err != nil {
				t.Fatal(err)
			}
			a.Block(b.ID(), 2*time.Second)
			deadline := time.Now().Add(30 * time.Second) // a bound on a hang, not a timing
			if !a.Blocked(b.ID()) || a.Blocked(c.ID()) {
				t.Fatal("Blocked disagrees with Block")
			}
			short := func() error {
				sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				_, err := b.Call(sctx, a.AddrInfo(), echoProto, []byte("x"))
				return err
			}
			switch tr {
			case "tcp":
				// Held unread; so is a call on a new connection.
				if err := short(); err == nil {
					t.Fatal("a blocked peer's call was answered")
				}
				b.LibP2P().Network().ClosePeer(a.ID())
				if err := short(); err == nil {
					t.Fatal("a blocked peer's call on a new connection was answered")
				}
			default:
				// Refused unread, with the reason; then reset as it opens.
				if err := short(); err == nil || !strings.Contains(err.Error(), "blocked") {
					t.Fatalf("a blocked peer's call: %v", err)
				}
				if err := short(); err == nil || strings.Contains(err.Error(), "blocked") {
					t.Fatalf("a blocked peer's call after it was told why: %v, want a reset stream", err)
				}
			}
			if _, err := c.Call(ctx, a.AddrInfo(), echoProto, []byte("x")); err != nil {
				t.Fatalf("another peer: %v", err)
			}
			if n := runs.Load(); n != 2 {
				t.Errorf("handler ran %d times while b was blocked, want 2", n)
			}
			// The block ends.
			for a.Blocked(b.ID()) && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			var err error
			for time.Now().Before(deadline) {
				if _, err = b.Call(ctx, a.AddrInfo(), echoProto, []byte("x")); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				t.Fatalf("after the block: %v", err)
			}
		})
	}
}

func TestBlockTableBounded(t *testing.T) {
	h := newHost(t, "tcp", Config{})
	for i := range maxBlocked + 100 {
		id, _ := newTestID(i)
		h.Block(id, time.Duration(i+1)*time.Minute)
	}
	h.mu.Lock()
	n := len(h.blocked)
	h.mu.Unlock()
	if n > maxBlocked {
		t.Fatalf("%d blocks held, at most %d", n, maxBlocked)
	}
}

// newTestID returns a fresh peer ID (i only names the call).
func newTestID(int) (peer.ID, error) {
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return "", err
	}
	return peer.IDFromPublicKey(pub)
}
