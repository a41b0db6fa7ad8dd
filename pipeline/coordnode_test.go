package pipeline

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/node"
)

// lockedBuffer is a bytes.Buffer safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A coordinator on a node with a DHT publishes its status record there,
// with its iterations and workers; one whose DHT cannot be joined runs on
// a node without one and says so.
func TestCoordinatorNodeStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	loopback := node.NetConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}}
	seed, err := node.New(ctx, node.Config{Net: loopback})
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	seedAddrs := node.BootstrapAddrs([]peer.AddrInfo{seed.Host().AddrInfo()})

	cfg := CoordinatorConfig{Region: "eu"}
	n, err := StartCoordinatorNode(ctx, cfg, CoordinatorNode{DHT: seedAddrs, StatusEvery: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if h := n.Config().Host; h == nil || h.MaxMessageBytes != callBytes || h.MaxStreamBytes != int64(DefaultMaxMessageBytes)+1<<20 {
		t.Fatalf("node's host config %+v lacks the coordinator's message limits", h)
	}
	cfg.Transport = n.Host()
	c, err := NewCoordinator(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Host() != n.Host() {
		t.Error("the coordinator's host is not the node's")
	}
	live := &metrics.Live{}
	RecordStatus(live, IterStats{Iter: 4, Loss: 0.5}, 8)
	if err := PublishStatus(n, c, live); err != nil {
		t.Fatal(err)
	}
	for {
		st, _, _ := metrics.ReadStatus(ctx, seed.DHT(), time.Now())
		if len(st) == 1 {
			s := st[0]
			if s.Role != metrics.RoleCoordinator || s.Region != "eu" || s.Step != 5 || s.Samples != 40 || s.Pipeline == nil || s.Pipeline.Iter != 4 {
				t.Fatalf("status record %+v", s)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no status record: %v", ctx.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A DHT peer that is gone: the node runs without a DHT.
	gone := seed.Host().AddrInfo()
	seed.Close()
	var log lockedBuffer
	n2, err := StartCoordinatorNode(ctx, CoordinatorConfig{}, CoordinatorNode{DHT: node.BootstrapAddrs([]peer.AddrInfo{gone}), StatusEvery: time.Second, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close()
	if n2.DHT() != nil || !strings.Contains(log.String(), "training without publishing a status record") {
		t.Errorf("DHT %v, log %q", n2.DHT(), log.String())
	}
	if err := PublishStatus(n2, c, live); err != nil {
		t.Error(err)
	}
}
