//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/netem"
)

// TestNATPeerJoinsThroughRelay runs skyhive processes in network
// namespaces joined by netem's router: "home" is behind a NAT that accepts
// no inbound connections. A peer outside cannot dial home directly, but
// reaches it through a relay that home reserved a slot on (root only).
func TestNATPeerJoinsThroughRelay(t *testing.T) {
	if err := netem.NamespaceSupport(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n, err := netem.New(netem.Uniform(netem.LinkParams{Latency: 2 * time.Millisecond}), 1)
	if err != nil {
		t.Fatal(err)
	}
	ids := []peer.ID{"relay", "home", "other"}
	for _, id := range ids {
		if err := n.Assign(id, netem.UniformRegion); err != nil {
			t.Fatal(err)
		}
	}
	topo, err := netem.NewTopology(ctx, n, ids, netem.TopologyOptions{Prefix: "skyhive-relay", NAT: []peer.ID{"home"}})
	if err != nil {
		t.Skipf("namespaces cannot be created here: %v", err)
	}
	defer topo.Close()
	// run starts `skyhive args...` in id's namespace and returns its first
	// JSON line's addresses (for long-running ones) or waits for it.
	run := func(id peer.ID, args ...string) (*nsProc, []string) {
		cmd, err := topo.Command(ctx, id, os.Args[0], args...)
		if err != nil {
			t.Fatal(err)
		}
		p := &nsProc{cmd: cmd, done: make(chan struct{})}
		cmd.Env = append(os.Environ(), envAsCLI+"=1")
		cmd.Stderr = &p.stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		r, w := io.Pipe()
		cmd.Stdout = w
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { p.err = cmd.Wait(); w.Close(); close(p.done) }()
		t.Cleanup(func() { cmd.Process.Kill(); <-p.done })
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var line struct{ Addrs []string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && len(line.Addrs) > 0 {
				go io.Copy(io.Discard, r)
				return p, line.Addrs
			}
			p.out.WriteString(sc.Text() + "\n")
		}
		return p, nil
	}
	_, relayAddrs := run("relay", "dht", "--listen", "/ip4/10.77.0.1/tcp/4001", "--relay-service", "--reachability", "public", "--json")
	if len(relayAddrs) == 0 {
		t.Fatal("relay printed no address")
	}
	relay := relayAddrs[0]
	home, homeAddrs := run("home", "dht", "--listen", "/ip4/10.77.0.2/tcp/4002", "--dht", relay, "--relay", relay,
		"--reachability", "private", "--json")
	if len(homeAddrs) == 0 {
		t.Fatalf("home printed no address: %s", home.stderr.String())
	}
	homeID := homeAddrs[0][strings.LastIndex(homeAddrs[0], "/p2p/")+len("/p2p/"):]
	direct := "/ip4/10.77.0.2/tcp/4002/p2p/" + homeID
	circuit := relay + "/p2p-circuit/p2p/" + homeID
	put := func(via string) (string, error) {
		p, _ := run("other", "dht", "put", "--listen", "/ip4/10.77.0.3/tcp/0", "--dht", via, "--timeout", "10s", "k", "v")
		<-p.done
		return p.out.String() + p.stderr.String(), p.err
	}
	if out, err := put(direct); err == nil {
		t.Fatalf("other reached home directly through the NAT:\n%s", out)
	}
	if out, err := put(circuit); err != nil || !strings.Contains(out, "stored on") {
		t.Fatalf("other could not reach home through the relay: %v\n%s", err, out)
	}
	if topo.Stats().NATDrops == 0 {
		t.Errorf("the NAT dropped nothing: %+v", topo.Stats())
	}
}

// nsProc is a skyhive process in a namespace.
type nsProc struct {
	cmd         interface{ Wait() error }
	out, stderr strings.Builder
	done        chan struct{}
	err         error
}
