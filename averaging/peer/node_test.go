package peer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	libp2ppeer "github.com/libp2p/go-libp2p/core/peer"
	"github.com/skyhive/skyhive/averaging/optimizer"
	"github.com/skyhive/skyhive/data"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
)

// TestRunOnANode: a peer runs on a node it is handed, under that node's
// peer ID, and leaves the node open; a node whose DHT is a client is
// refused.
func TestRunOnANode(t *testing.T) {
	if _, err := data.LoadFashionMNIST("", data.Test, data.LoadOptions{Limit: 1}); err != nil {
		t.Skipf("Fashion-MNIST not installed: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seed := node.BootstrapAddrs([]libp2ppeer.AddrInfo{startDHT(t)})
	n, err := node.New(ctx, node.Config{Net: node.NetConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}}, DHT: node.DHTConfig{Bootstrap: seed}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	cfg := Config{
		RunID: "run-on-node", Algo: optimizer.Local, GroupSize: 2, MinPeers: 1, WaitPeers: 20 * time.Second,
		RoundInterval: 200 * time.Millisecond, Limit: 500, EvalExamples: 100, Steps: 5,
	}
	res, err := RunOn(ctx, n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Peer != n.ID().String() || res.Steps != cfg.Steps {
		t.Fatalf("peer %s ran %d steps, want node %s and %d steps", res.Peer, res.Steps, n.ID(), cfg.Steps)
	}
	// The node is still open: its DHT node stores and reads.
	if _, err := n.DHT().Store(ctx, "after-run", "", []byte("x"), time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("the node's DHT after the run: %v", err)
	}

	client, err := node.New(ctx, node.Config{Net: node.NetConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}}, DHT: node.DHTConfig{Mode: node.DHTClient, Bootstrap: seed}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := RunOn(ctx, client, cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("a peer on a DHT client: %v", err)
	}
}

// TestRunCannotJoin: a DHT that does not answer is ErrDHT, naming the
// address and what to check.
func TestRunCannotJoin(t *testing.T) {
	addr := "/ip4/127.0.0.1/tcp/1/p2p/" + startDHT(t).ID.String() // nobody listens there
	seeds, err := p2p.ParseAddrInfos([]string{addr})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{DHT: seeds, JoinTimeout: 2 * time.Second, Steps: 1}
	cfg.Host.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	_, err = Run(context.Background(), cfg)
	if !errors.Is(err, ErrDHT) || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "check the address") {
		t.Fatalf("join through nobody: %v", err)
	}
}
