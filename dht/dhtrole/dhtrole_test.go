package dhtrole

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
)

// fieldsOf returns the fields a *launch.FieldError names, nil for other
// errors.
func fieldsOf(err error) []string {
	var fe *launch.FieldError
	if errors.As(err, &fe) {
		return fe.Fields
	}
	return nil
}

// The options a DHT command refuses are FieldErrors naming them.
func TestChecks(t *testing.T) {
	if f := fieldsOf(Check(launch.DHT{Output: launch.Output{Stats: "s.jsonl"}})); !slices.Equal(f, []string{"stats_every"}) {
		t.Errorf("stats without a period: %v", f)
	}
	if err := Check(launch.DHT{StatsEvery: launch.Duration(time.Second)}); err != nil {
		t.Error(err)
	}
	for _, ttl := range []time.Duration{0, dht.DefaultMaxTTL + time.Second} {
		if f := fieldsOf(CheckTTL(ttl)); !slices.Equal(f, []string{"ttl"}) {
			t.Errorf("ttl %v: %v", ttl, f)
		}
	}
	op := func(context.Context, *p2p.Host, *dht.Node) error { return nil }
	if f := fieldsOf(WithClient(context.Background(), p2p.Config{}, nil, time.Second, op)); !slices.Equal(f, []string{"dht"}) {
		t.Errorf("a client without DHT peers: %v", f)
	}
}

// A client stores a record on a DHT node run by Run and reads it back.
func TestRunPutGet(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan []string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			Node: node.Config{Net: node.NetConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}}},
			DHT:  launch.DHT{StatsEvery: launch.Duration(time.Second)},
			Announce: func(_ context.Context, h *p2p.Host) {
				addrs <- node.BootstrapAddrs([]peer.AddrInfo{h.AddrInfo()})
			},
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	var seeds []string
	select {
	case seeds = <-addrs:
	case <-time.After(10 * time.Second):
		t.Fatal("the DHT node did not start")
	}
	client := p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}}
	var out strings.Builder
	err := WithClient(ctx, client, seeds, 10*time.Second, func(ctx context.Context, _ *p2p.Host, n *dht.Node) error {
		if err := Put(ctx, n, "k", "", []byte("v"), time.Minute, &out); err != nil {
			return err
		}
		return Get(ctx, n, "k", &out)
	})
	if err != nil || !strings.Contains(out.String(), "stored on 1 peers") || !strings.Contains(out.String(), "v") {
		t.Fatalf("%v\n%s", err, out.String())
	}
}
