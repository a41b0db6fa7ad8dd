package p2p

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

func TestClassifyReach(t *testing.T) {
	addrs := func(ss ...string) []ma.Multiaddr {
		var out []ma.Multiaddr
		for _, s := range ss {
			out = append(out, ma.StringCast(s))
		}
		return out
	}
	const relayed = "/ip4/1.2.3.5/tcp/4001/p2p/12D3KooWHtz3SAKgN44ngiGCvvvWoaPiiymfDZXhSqyjw3q17bWd/p2p-circuit"
	cases := []struct {
		r      Reachability
		addrs  []ma.Multiaddr
		status string
		advice string // a word the advice must hold ("" for none)
	}{
		{ReachabilityPublic, addrs("/ip4/1.2.3.4/tcp/4001"), "public", ""},
		{ReachabilityPrivate, addrs("/ip4/192.168.1.5/tcp/4001", relayed), "relay", "--announce"},
		{ReachabilityPrivate, addrs("/ip4/192.168.1.5/tcp/4001"), "unreachable", "--relay"},
		{ReachabilityAuto, addrs("/ip4/127.0.0.1/tcp/4001", "/ip4/10.0.0.2/udp/4001/quic-v1"), "local", "--listen"},
		{ReachabilityAuto, addrs("/ip4/1.2.3.4/tcp/4001"), "unknown", "doctor"},
	}
	for _, c := range cases {
		r := classifyReach(c.r, c.addrs, "/p2p/ME")
		if r.Status != c.status || !strings.Contains(r.Advice, c.advice) || (c.advice == "") != (r.Advice == "") {
			t.Errorf("%v %v: got %q (%s)", c.r, c.addrs, r.Status, r.Advice)
		}
		if len(r.Addrs) != len(c.addrs) || !strings.HasSuffix(r.Addrs[0], "/p2p/ME") {
			t.Errorf("%v: addrs %v", c.addrs, r.Addrs)
		}
	}
}

// A host reports its configured reachability, and a loopback host that
// AutoNAT has not judged says others on other networks cannot reach it.
func TestHostReach(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		r    Reachability
		want string
	}{{ReachabilityAuto, "local"}, {ReachabilityPublic, "public"}, {ReachabilityPrivate, "unreachable"}} {
		h, err := New(ctx, Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, Reachability: c.r})
		if err != nil {
			t.Fatal(err)
		}
		var got []Reach
		wctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- h.WatchReach(wctx, func(r Reach) { got = append(got, r) }) }()
		stop()
		<-done
		if r := h.Reach(); r.Status != c.want || len(r.Addrs) == 0 || !strings.Contains(r.Addrs[0], h.ID().String()) {
			t.Errorf("%v: %+v", c.r, r)
		}
		if len(got) != 1 || got[0].Status != c.want {
			t.Errorf("%v: WatchReach reported %+v", c.r, got)
		}
		h.Close()
	}
}

// A relay with the relay service grants a reservation; a peer without it
// refuses, and New fails saying which relay.
func TestCheckRelays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	loop := []string{"/ip4/127.0.0.1/tcp/0"}
	relay, err := New(ctx, Config{ListenAddrs: loop, RelayService: true, Reachability: ReachabilityPublic})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	plain, err := New(ctx, Config{ListenAddrs: loop})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	for _, c := range []struct {
		relay *Host
		ok    bool
	}{{relay, true}, {plain, false}} {
		h, err := New(ctx, Config{ListenAddrs: loop, StaticRelays: []peer.AddrInfo{c.relay.AddrInfo()}, Reachability: ReachabilityPrivate})
		if err == nil {
			h.Close()
		}
		if (err == nil) != c.ok || (err != nil && (!errors.Is(err, ErrRelay) || !strings.Contains(err.Error(), c.relay.ID().ShortString()))) {
			t.Errorf("relay service %v: %v", c.ok, err)
		}
	}
}
