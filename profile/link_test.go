package profile

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/p2p"
)

func newHost(t *testing.T) *p2p.Host {
	t.Helper()
	h, err := p2p.New(context.Background(), p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}})
	if err != nil {
		t.Fatalf("p2p.New: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

func TestMeasureLinksLoopback(t *testing.T) {
	a, b := newHost(t), newHost(t)
	RegisterHandlers(b)
	// A third host that never registered the handlers: its measurement
	// fails, and the error says which peer, without hiding b's link.
	c := newHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	o := LinkOptions{Pings: 8, PayloadBytes: 4 << 20, BandwidthReps: 3, Timeout: 10 * time.Second, Seed: 1}
	links, err := MeasureLinks(ctx, a, []peer.AddrInfo{a.AddrInfo(), b.AddrInfo(), c.AddrInfo()}, o)
	if err == nil || !strings.Contains(err.Error(), c.ID().String()) {
		t.Errorf("measuring a peer without handlers: err %v", err)
	}
	if len(links) != 1 {
		t.Fatalf("got %d links, want 1 (to b): %+v", len(links), links)
	}
	l := links[0]
	t.Logf("loopback: latency %.3f ms (rtt %.3f..%.3f ms), bandwidth %.0f MB/s", 1e3*l.Latency, 1e3*l.RTTMin, 1e3*l.RTTMax, l.Bandwidth/1e6)
	if l.From != a.ID().String() || l.To != b.ID().String() || l.PayloadBytes != 4<<20 {
		t.Errorf("link ends %+v", l)
	}
	// Loopback: well under 20 ms one way, and faster than 20 MB/s even on
	// two busy cores (libp2p with TLS does hundreds of MB/s here).
	if !(l.Latency > 0 && l.Latency < 0.02) {
		t.Errorf("latency %g s", l.Latency)
	}
	if !(l.RTTMin <= 2*l.Latency && 2*l.Latency <= l.RTTMax) {
		t.Errorf("median rtt %g outside [%g, %g]", 2*l.Latency, l.RTTMin, l.RTTMax)
	}
	if !(l.Bandwidth > 20e6 && l.Bandwidth < 1e12) {
		t.Errorf("bandwidth %g B/s", l.Bandwidth)
	}

	// The links feed a cluster profile keyed by peer IDs.
	cp := &ClusterProfile{Format: ClusterFormat, Devices: []Device{
		{Name: "a", Peer: a.ID().String(), Speed: 1e11, MemBytes: 1 << 30},
		{Name: "b", Peer: b.ID().String(), Speed: 1e11, MemBytes: 1 << 30},
	}, Links: links}
	ac, err := cp.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	if got := ac.Link(0, 1); got.Latency != l.Latency || got.Bandwidth != l.Bandwidth {
		t.Errorf("alloc link %+v, measured %+v", got, l)
	}

	// A context that ends stops the measurement with its error.
	done, stop := context.WithCancel(ctx)
	stop()
	if _, err := MeasureLink(done, a, b.AddrInfo(), o); err == nil {
		t.Error("cancelled measurement succeeded")
	}
}

func TestPingHandlerLimit(t *testing.T) {
	a, b := newHost(t), newHost(t)
	RegisterHandlers(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.Call(ctx, b.AddrInfo(), PingProtocol, make([]byte, maxPingBytes+1)); err == nil {
		t.Error("oversized ping echoed")
	}
}
