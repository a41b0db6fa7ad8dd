package netem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/p2p/memnet"
)

// A call through the wrapper pays the link's latency each way, the callee
// is assigned to the default region on first contact, and a cut link fails
// the call.
func TestTransportDelaysCalls(t *testing.T) {
	mem := memnet.NewNetwork()
	defer mem.Close()
	a, err := mem.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	b, err := mem.NewPeer()
	if err != nil {
		t.Fatal(err)
	}
	b.SetHandler("/skyhive/test/echo/1.0.0", func(_ context.Context, _ peer.ID, req []byte) ([]byte, error) { return req, nil })
	const oneWay = 30 * time.Millisecond
	n, err := netem.Delay(oneWay)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := netem.NewTransport(a, n, netem.UniformRegion)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0 := time.Now()
	resp, err := tr.Call(ctx, b.AddrInfo(), "/skyhive/test/echo/1.0.0", []byte("hi"))
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el < 2*oneWay {
		t.Fatalf("call took %v, less than the round-trip time %v", el, 2*oneWay)
	}
	if string(resp) != "hi" {
		t.Fatalf("response %q", resp)
	}
	if r, ok := n.Region(b.ID()); !ok || r != netem.UniformRegion {
		t.Fatalf("callee region %q, %v; want default", r, ok)
	}
	n.Block(a.ID(), b.ID())
	if _, err := tr.Call(ctx, b.AddrInfo(), "/skyhive/test/echo/1.0.0", nil); !errors.Is(err, netem.ErrUnreachable) {
		t.Fatalf("call over a blocked link: %v, want ErrUnreachable", err)
	}
}
