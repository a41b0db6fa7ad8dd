package main

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/tensor"
	"github.com/skyhive/skyhive/wire"
)

// TestSlowStreamsDoNotStarveHonestPeers holds slow streams open against a
// DHT node and an expert server (real processes) from 64 identities of
// one address (`skyhive attack --slow-identities 64` from 127.0.0.1, the
// streams announcing requests and trickling a byte every 250 ms), and
// meanwhile stores, reads and calls an expert from another address every
// half second: each honest operation must succeed within 2 s. Together
// the identities can open more streams of a protocol than libp2p lets the
// protocol hold (1,265 held on this 24 GiB machine, where libp2p scales
// its limits with memory): before the per-address bound, a new peer could
// not even join the DHT ("stream reset by remote"). What one address may
// hold while its requests are read is now bounded below that
// (p2p.Config.MaxPendingPerAddr, 128).
func TestSlowStreamsDoNotStarveHonestPeers(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("holds slow streams against two processes for about a minute")
	}
	// The victims listen on IPv4 and IPv6 loopback; the attacker comes
	// from 127.0.0.1 and the honest side from ::1 (on loopback every IPv4
	// dial leaves from 127.0.0.1, whatever address the dialer listens on).
	if l, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		t.Skip("no IPv6 loopback:", err)
	} else {
		l.Close()
	}
	const both = loopback + ",/ip6/::1/tcp/0"
	_, dhtAddr, dhtOut := startListening(t, "dht", "--listen", both)
	_, srvAddr, srvOut := startListening(t, "server", "--dht", dhtAddr, "--listen", both, "--experts", "ffn.[0:2]", "--hidden", "64")
	six := regexp.MustCompile(`/ip6/::1/tcp/\d+/p2p/\w+`)
	var honest []string
	for _, out := range []*syncBuffer{dhtOut, srvOut} {
		waitFor(t, "an IPv6 address", 10*time.Second, func() bool { return six.MatchString(out.String()) })
		honest = append(honest, six.FindString(out.String()))
	}
	var report syncBuffer
	attack := startCLIWith(t, &report, &report, "attack", "--target", dhtAddr, "--target", srvAddr, "--listen", loopback,
		"--identities", "1", "--rate", "1", "--slow-identities", "64", "--slow-rate", "1000", "--duration", "25s", "--json")

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	h, err := p2p.New(ctx, p2p.Config{ListenAddrs: []string{"/ip6/::1/tcp/0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	seeds, err := p2p.ParseAddrInfos(honest)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range seeds { // the DHT's calls then go over these connections
		if err := h.Connect(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	dn, err := dht.New(h, dht.Config{ClientMode: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dn.Close()
	if err := dn.Bootstrap(ctx, seeds[:1]); err != nil {
		t.Fatal(err)
	}
	x := tensor.New(4, 64)
	for i := range x.Data {
		x.Data[i] = float32(i%5) / 5
	}
	fwd, err := moe.EncodeRequest("ffn.0", []wire.Named{{Name: "x", Tensor: x}}, wire.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Let the slow streams pile up, then operate while they are held (the
	// victims cut each after about their 30 s idle timeout).
	time.Sleep(5 * time.Second)
	var worst time.Duration
	var slow []string
	for i := 0; i < 36; i++ {
		op := func(name string, f func(ctx context.Context) error) {
			octx, ocancel := context.WithTimeout(ctx, 2*time.Second)
			defer ocancel()
			start := time.Now()
			err := f(octx)
			d := time.Since(start)
			worst = max(worst, d)
			if err != nil {
				slow = append(slow, fmt.Sprintf("%s %d after %v: %v", name, i, d.Round(time.Millisecond), err))
			}
		}
		key := fmt.Sprint("honest-", i)
		op("store", func(ctx context.Context) error {
			n, err := dn.Store(ctx, key, "", []byte("v"), time.Now().Add(time.Minute))
			if err == nil && n == 0 {
				err = fmt.Errorf("stored on no node")
			}
			return err
		})
		op("get", func(ctx context.Context) error {
			items, err := dn.Get(ctx, key)
			if err == nil && len(items) == 0 {
				err = fmt.Errorf("not found")
			}
			return err
		})
		op("forward", func(ctx context.Context) error {
			_, err := h.Call(ctx, seeds[1], moe.ForwardProtocol, fwd)
			return err
		})
		time.Sleep(500 * time.Millisecond)
	}
	if err := attack.wait(t, 2*time.Minute); err != nil && !strings.Contains(report.String(), "breaches") {
		t.Logf("attack: %v", err)
	}
	t.Logf("worst honest operation %v; attack report:\n%s", worst.Round(time.Millisecond), tail(report.String()))
	if len(slow) > 0 {
		t.Fatalf("%d honest operations failed or took over 2 s while slow streams were held:\n%s", len(slow), strings.Join(slices.Clip(slow)[:min(len(slow), 10)], "\n"))
	}
}
