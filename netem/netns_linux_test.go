//go:build linux

package netem

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

func needNamespaces(t *testing.T) {
	t.Helper()
	if err := NamespaceSupport(); err != nil {
		t.Skip(err)
	}
}

// namespacesWithPrefix lists existing namespaces that start with prefix.
func namespacesWithPrefix(prefix string) []string {
	entries, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestTopologyRoutesAndTearsDown(t *testing.T) {
	needNamespaces(t)
	n := newTestNet(t, LinkParams{Latency: 10 * time.Millisecond, Bandwidth: 100e6}, "a", "b", "c")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	topo, err := NewTopology(ctx, n, []peer.ID{"a", "b", "c"}, TopologyOptions{Prefix: "skyhive-test"})
	if err != nil {
		t.Skipf("namespaces cannot be created here: %v", err)
	}
	prefix := "skyhive-test-" + strconv.Itoa(os.Getpid()) + "-"
	defer func() {
		topo.Close()
		if left := namespacesWithPrefix(prefix); len(left) > 0 {
			t.Errorf("namespaces left after Close: %v", left)
		}
	}()
	if got := namespacesWithPrefix(prefix); len(got) != 3 {
		t.Fatalf("namespaces %v, want 3", got)
	}
	addrC, _ := topo.Addr("c")
	if addrC != netip.MustParseAddr("10.77.0.3") {
		t.Errorf("c has address %v", addrC)
	}
	var ln net.Listener
	if err := topo.Do("c", func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addrC, 7000).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	echoDone := make(chan struct{})
	go func() {
		defer close(echoDone)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		accepted <- c
		io.Copy(c, c)
	}()
	defer func() {
		// The echo's peer may be gone with its namespace: close both ends.
		ln.Close()
		select {
		case sc := <-accepted:
			sc.Close()
		default:
		}
		<-echoDone
	}()
	var c net.Conn
	t0 := time.Now()
	if err := topo.Do("a", func() (err error) {
		c, err = net.DialTimeout("tcp", "10.77.0.3:7000", 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if d := time.Since(t0); d < 20*time.Millisecond {
		t.Errorf("TCP handshake took %v, want at least one 20 ms round trip", d)
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q %v", buf, err)
	}
	// The peer namespace cannot reach the host's loopback services: it is
	// isolated, and its only route is the emulated subnet.
	cmd, err := topo.Command(ctx, "b", "ip", "-4", "addr", "show", "dev", "sky0")
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "10.77.0.2/24") {
		t.Errorf("ip addr in b: %s %v", out, err)
	}
	// A partition blackholes packets.
	n.Partition([]peer.ID{"a"}, []peer.ID{"c"})
	c.Write([]byte("lost"))
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.Read(buf); !isTimeout(err) {
		t.Errorf("read across partition: %v, want timeout", err)
	}
	if topo.Stats().Unreachable == 0 {
		t.Errorf("no packets counted unreachable: %+v", topo.Stats())
	}
	n.Heal()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "lost" {
		t.Errorf("after heal TCP retransmits: %q %v", buf, err)
	}
	// Cancelling the context tears the topology down.
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for len(namespacesWithPrefix(prefix)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if left := namespacesWithPrefix(prefix); len(left) > 0 {
		t.Errorf("namespaces left after cancel: %v", left)
	}
}

// TestAccuracyNamespaces checks mode 2: kernel TCP between two namespaces
// over a 50 ms, 20 Mbit/s link. Goodput is counted at the application, so
// it is 20 Mbit/s × 1448/1500 ≈ 19.3 Mbit/s at MTU 1500.
func TestAccuracyNamespaces(t *testing.T) {
	needNamespaces(t)
	if testing.Short() {
		t.Skip("accuracy measurement takes a few seconds")
	}
	checkAccuracy(t, "mode 2 (namespaces)", func() (Measurement, error) {
		return MeasureNamespaces(context.Background(), LinkParams{Latency: 50 * time.Millisecond, Bandwidth: 20e6},
			MeasureOptions{Pings: 10, Warmup: 2 * time.Second, Duration: 2 * time.Second})
	})
}

// TestTopologyNAT: a peer behind the NAT reaches out and gets answers, but
// a connection from outside to it never arrives.
func TestTopologyNAT(t *testing.T) {
	needNamespaces(t)
	n := newTestNet(t, LinkParams{Latency: time.Millisecond}, "pub", "home")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	topo, err := NewTopology(ctx, n, []peer.ID{"pub", "home"}, TopologyOptions{Prefix: "skyhive-nat", NAT: []peer.ID{"home"}})
	if err != nil {
		t.Skipf("namespaces cannot be created here: %v", err)
	}
	defer topo.Close()
	listen := func(id peer.ID) net.Listener {
		a, _ := topo.Addr(id)
		var ln net.Listener
		if err := topo.Do(id, func() (err error) {
			ln, err = net.Listen("tcp", netip.AddrPortFrom(a, 7000).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(c, c); c.Close() }()
			}
		}()
		return ln
	}
	dial := func(from, to peer.ID, timeout time.Duration) (net.Conn, error) {
		a, _ := topo.Addr(to)
		var c net.Conn
		err := topo.Do(from, func() (err error) {
			c, err = net.DialTimeout("tcp", netip.AddrPortFrom(a, 7000).String(), timeout)
			return err
		})
		return c, err
	}
	defer listen("pub").Close()
	defer listen("home").Close()
	// Out of the NAT: the flow is opened from inside, the echo comes back.
	c, err := dial("home", "pub", 5*time.Second)
	if err != nil {
		t.Fatalf("home → pub: %v", err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the NAT: %q %v", buf, err)
	}
	c.Close()
	// Into the NAT: the SYN is dropped.
	if c, err := dial("pub", "home", 500*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("pub → home connected through the NAT")
	}
	if topo.Stats().NATDrops == 0 {
		t.Errorf("no NAT drops counted: %+v", topo.Stats())
	}
}
