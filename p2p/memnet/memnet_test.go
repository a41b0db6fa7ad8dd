package memnet

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/goleak"

	"github.com/skyhive/skyhive/p2p"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const proto = "/test/echo/1.0.0"

func newPeers(t *testing.T, n *Network, k int) []*Peer {
	t.Helper()
	out := make([]*Peer, k)
	for i := range out {
		p, err := n.NewPeer()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = p
	}
	return out
}

func TestCallEchoAndNoAliasing(t *testing.T) {
	n := NewNetwork()
	defer n.Close()
	ps := newPeers(t, n, 2)
	a, b := ps[0], ps[1]
	var gotFrom peer.ID
	var kept []byte
	b.SetHandler(proto, func(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
		gotFrom = from
		kept = req
		return req, nil
	})
	req := []byte("hello")
	resp, err := a.Call(context.Background(), b.AddrInfo(), proto, req)
	if err != nil {
		t.Fatal(err)
	}
	if gotFrom != a.ID() {
		t.Fatalf("handler saw from=%s, want %s", gotFrom, a.ID())
	}
	if !bytes.Equal(resp, []byte("hello")) {
		t.Fatalf("resp %q", resp)
	}
	req[0] = 'X'
	resp[1] = 'Y'
	if string(kept) != "hello" {
		t.Fatalf("handler's request aliased the caller's: %q", kept)
	}
	if len(a.AddrInfo().Addrs) != 1 || a.AddrInfo().Addrs[0].String() == b.AddrInfo().Addrs[0].String() {
		t.Fatalf("addresses: %v %v", a.AddrInfo(), b.AddrInfo())
	}
}

func TestRemoteErrorAndUnknownProtocol(t *testing.T) {
	n := NewNetwork()
	defer n.Close()
	ps := newPeers(t, n, 2)
	ps[1].SetHandler(proto, func(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
		return nil, errors.New("nope")
	})
	_, err := ps[0].Call(context.Background(), ps[1].AddrInfo(), proto, nil)
	var re *p2p.RemoteError
	if !errors.As(err, &re) || re.Msg != "nope" || re.Peer != ps[1].ID() {
		t.Fatalf("got %v, want RemoteError nope", err)
	}
	_, err = ps[0].Call(context.Background(), ps[1].AddrInfo(), "/test/other/1.0.0", nil)
	if !errors.Is(err, ErrProtocolNotSupported) {
		t.Fatalf("got %v, want ErrProtocolNotSupported", err)
	}
}

func TestDeadlineHonoured(t *testing.T) {
	n := NewNetwork()
	defer n.Close()
	ps := newPeers(t, n, 2)
	ps[1].SetHandler(proto, func(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
		<-ctx.Done() // a handler that only stops when the caller gives up
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := ps[0].Call(ctx, ps[1].AddrInfo(), proto, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want deadline exceeded", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("call took %v", d)
	}
}

func TestKillReviveClose(t *testing.T) {
	n := NewNetwork()
	ps := newPeers(t, n, 3)
	for _, p := range ps {
		p.SetHandler(proto, func(ctx context.Context, from peer.ID, req []byte) ([]byte, error) { return []byte("ok"), nil })
	}
	ctx := context.Background()
	if err := n.Kill(ps[1].ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := ps[0].Call(ctx, ps[1].AddrInfo(), proto, nil); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("call to killed: %v", err)
	}
	if _, err := ps[1].Call(ctx, ps[0].AddrInfo(), proto, nil); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("call from killed: %v", err)
	}
	if n.Alive(ps[1].ID()) {
		t.Fatal("killed peer reported alive")
	}
	if err := n.Revive(ps[1].ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := ps[0].Call(ctx, ps[1].AddrInfo(), proto, nil); err != nil {
		t.Fatalf("call after revive: %v", err)
	}
	if err := ps[2].Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ps[0].Call(ctx, ps[2].AddrInfo(), proto, nil); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("call to closed peer: %v", err)
	}
	if _, err := ps[2].Call(ctx, ps[0].AddrInfo(), proto, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("call from closed peer: %v", err)
	}
	n.Close()
	if _, err := ps[0].Call(ctx, ps[1].AddrInfo(), proto, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after network close: %v", err)
	}
	if _, err := n.NewPeer(); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewPeer after close: %v", err)
	}
}

func TestKilledDuringCallLosesResponse(t *testing.T) {
	n := NewNetwork()
	defer n.Close()
	ps := newPeers(t, n, 2)
	ps[1].SetHandler(proto, func(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
		_ = n.Kill(ps[1].ID())
		return []byte("late"), nil
	})
	if _, err := ps[0].Call(context.Background(), ps[1].AddrInfo(), proto, nil); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("got %v, want ErrUnreachable", err)
	}
}

func TestBlackholeHangsUntilDeadline(t *testing.T) {
	n := NewNetwork(WithBlackhole())
	defer n.Close()
	ps := newPeers(t, n, 2)
	ps[1].SetHandler(proto, func(ctx context.Context, from peer.ID, req []byte) ([]byte, error) { return nil, nil })
	_ = n.Kill(ps[1].ID())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := ps[0].Call(ctx, ps[1].AddrInfo(), proto, nil)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) < 25*time.Millisecond {
		t.Fatalf("got %v after %v, want deadline after ~30ms", err, time.Since(t0))
	}
}

type countingLink struct {
	msgs, bytes atomic.Int64
	drop        atomic.Bool
}

func (l *countingLink) Deliver(ctx context.Context, from, to peer.ID, size int) error {
	if l.drop.Load() {
		return errors.New("dropped")
	}
	l.msgs.Add(1)
	l.bytes.Add(int64(size))
	return ctx.Err()
}

func TestLinkSeesBothDirectionsAndDrops(t *testing.T) {
	l := &countingLink{}
	n := NewNetwork(WithLink(l))
	defer n.Close()
	ps := newPeers(t, n, 2)
	ps[1].SetHandler(proto, func(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
		return make([]byte, 100), nil
	})
	if _, err := ps[0].Call(context.Background(), ps[1].AddrInfo(), proto, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if l.msgs.Load() != 2 || l.bytes.Load() != 110 {
		t.Fatalf("link saw %d msgs %d bytes, want 2 and 110", l.msgs.Load(), l.bytes.Load())
	}
	l.drop.Store(true)
	if _, err := ps[0].Call(context.Background(), ps[1].AddrInfo(), proto, nil); err == nil {
		t.Fatal("dropped message did not fail the call")
	}
	n.SetLink(nil)
	if _, err := ps[0].Call(context.Background(), ps[1].AddrInfo(), proto, nil); err != nil {
		t.Fatalf("after SetLink(nil): %v", err)
	}
}

func TestInboundBounded(t *testing.T) {
	var link countingLink
	n := NewNetwork(WithMaxInbound(2), WithLink(&link))
	defer n.Close()
	ps := newPeers(t, n, 2)
	var running, peak atomic.Int32
	release := make(chan struct{})
	ps[1].SetHandler(proto, func(ctx context.Context, from peer.ID, req []byte) ([]byte, error) {
		r := running.Add(1)
		for {
			p := peak.Load()
			if r <= p || peak.CompareAndSwap(p, r) {
				break
			}
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		running.Add(-1)
		return nil, nil
	})
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = ps[0].Call(ctx, ps[1].AddrInfo(), proto, nil)
		}()
	}
	// Wait until all six requests arrived and two handlers run: the other
	// four wait for them.
	deadline := time.Now().Add(10 * time.Second)
	for link.msgs.Load() < 6 || running.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests delivered, %d handlers running", link.msgs.Load(), running.Load())
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if peak.Load() > 2 {
		t.Fatalf("%d handlers ran at once, limit 2", peak.Load())
	}
}

func TestManyPeers(t *testing.T) {
	n := NewNetwork()
	defer n.Close()
	ps := newPeers(t, n, 1000)
	seen := make(map[peer.ID]bool)
	for _, p := range ps {
		if seen[p.ID()] {
			t.Fatal("duplicate id")
		}
		seen[p.ID()] = true
	}
	if len(n.Peers()) != 1000 {
		t.Fatalf("%d peers", len(n.Peers()))
	}
}
