package blocklist_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/p2p"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const echoProto protocol.ID = "/skyhive/test/echo/1.0.0"

var transports = []string{"tcp", "quic"}

func newHost(t testing.TB, transport string) *p2p.Host {
	t.Helper()
	listen := "/ip4/127.0.0.1/tcp/0"
	if transport == "quic" {
		listen = "/ip4/127.0.0.1/udp/0/quic-v1"
	}
	h, err := p2p.New(context.Background(), p2p.Config{ListenAddrs: []string{listen}})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// countingEcho is an echo handler that counts its runs.
func countingEcho(n *atomic.Int64) p2p.Handler {
	return func(_ context.Context, _ peer.ID, req []byte) ([]byte, error) {
		n.Add(1)
		return req, nil
	}
}

// A blocked peer's calls are not served: over TCP they wait unread until
// the block ends, over QUIC the first is refused with the reason and later
// ones are reset; others are served; the block ends.
func TestBlock(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a := newHost(t, tr)
			b := newHost(t, tr)
			c := newHost(t, tr)
			var runs atomic.Int64
			a.SetHandler(echoProto, countingEcho(&runs))
			ctx := ctxT(t, 40*time.Second)
			if _, err := b.Call(ctx, a.AddrInfo(), echoProto, []byte("x")); err != nil {
				t.Fatal(err)
			}
			a.BlockList().Block(b.ID(), 2*time.Second)
			deadline := time.Now().Add(30 * time.Second) // a bound on a hang, not a timing
			if !a.BlockList().Blocked(b.ID()) || a.BlockList().Blocked(c.ID()) {
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
			for a.BlockList().Blocked(b.ID()) && time.Now().Before(deadline) {
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
