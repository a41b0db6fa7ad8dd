package dashboard_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/p2p"
)

// localSwarm is a small swarm in this process: real libp2p hosts on
// loopback, each with a DHT node, publishing status records with real
// publishers whose numbers change as if they trained.
type localSwarm struct {
	nodes  []*dht.Node
	hosts  []*p2p.Host
	reader *dht.Node // a light client, as skyhive dashboard runs
	ids    []string  // the publishers' peer IDs
}

// member is one publisher of the swarm.
type member struct {
	role, region string
	sample       func(step int64, s *metrics.Status)
}

// startSwarm starts the members, each publishing every period, until ctx
// ends; the test's cleanup stops them.
func startSwarm(t *testing.T, ctx context.Context, period time.Duration, members []member) *localSwarm {
	t.Helper()
	ls := &localSwarm{}
	newNode := func(client bool) (*p2p.Host, *dht.Node) {
		h, err := p2p.New(ctx, p2p.Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}})
		if err != nil {
			t.Fatal(err)
		}
		n, err := dht.New(h, dht.Config{PrivKey: h.LibP2P().Peerstore().PrivKey(h.ID()), ClientMode: client})
		if err != nil {
			h.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close(); h.Close() })
		if len(ls.hosts) > 0 {
			if err := n.Bootstrap(ctx, []peer.AddrInfo{ls.hosts[0].AddrInfo()}); err != nil {
				t.Fatal(err)
			}
		}
		return h, n
	}
	for range members {
		h, n := newNode(false)
		ls.hosts, ls.nodes = append(ls.hosts, h), append(ls.nodes, n)
		ls.ids = append(ls.ids, h.ID().String())
	}
	_, ls.reader = newNode(true)
	pctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	for i, m := range members {
		var step int64
		p, err := metrics.NewPublisher(metrics.PublisherConfig{
			DHT: ls.nodes[i], Peer: ls.ids[i], Role: m.role, Region: m.region, Version: "test", Period: period,
			Host: metrics.HostStatus(ls.hosts[i]),
			Sample: func(s *metrics.Status) {
				step += 10
				if m.sample != nil {
					m.sample(step, s)
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = p.Run(pctx) })
	}
	return ls
}

// read is the dashboard's source on the swarm's light client.
func (ls *localSwarm) read(ctx context.Context, now time.Time) ([]metrics.Status, int, error) {
	return metrics.ReadStatus(ctx, ls.reader, now)
}

// trainingPeer makes the numbers of an averaging peer whose loss falls
// and accuracy rises with its steps, at its own pace.
func trainingPeer(pace float64) func(int64, *metrics.Status) {
	return func(step int64, s *metrics.Status) {
		x := pace * float64(step)
		s.Step, s.Samples = step, 32*step
		s.Loss = metrics.Float(0.35 + 1.9*math.Exp(-x/120) + 0.04*math.Sin(x/7))
		s.Accuracy = metrics.Float(0.88 - 0.75*math.Exp(-x/150))
		s.Averaging = &metrics.AveragingStatus{Run: "fashion", Algo: "wagma", Round: step / 20, Groups: step / 22, GroupMembers: 3 * (step / 22), SwarmPeers: 3}
	}
}

// expertServer serves the experts of rows [lo, hi) of an 8×8 grid, the
// low columns busier.
func expertServer(lo, hi int) func(int64, *metrics.Status) {
	return func(step int64, s *metrics.Status) {
		e := &metrics.ExpertsStatus{}
		for r := lo; r < hi; r++ {
			for c := range 8 {
				calls := step * int64(8-c) * int64(1+r%3)
				e.Loads = append(e.Loads, metrics.ExpertLoad{UID: fmt.Sprintf("ffn.%d.%d", r, c), Calls: calls, Rows: 16 * calls})
				e.Requests += calls
			}
		}
		e.Hosted = len(e.Loads)
		s.Step, s.Samples, s.Experts = step, 64*step, e
	}
}

// coordinator runs a four-stage pipeline whose second stage is the
// bottleneck.
func coordinator(step int64, s *metrics.Status) {
	s.Step, s.Samples = step, 64*step
	s.Loss = metrics.Float(0.5 + 1.5*math.Exp(-float64(step)/150))
	p := &metrics.PipelineStatus{Iter: step, Plan: 2, Seconds: 0.42, Workers: 4, Event: "re-planned after w2's speed drifted 35%"}
	for i, w := range []string{"w0", "w1", "w2", "w3"} {
		compute := []float64{0.21, 0.33, 0.24, 0.18}[i]
		p.Stages = append(p.Stages, metrics.Stage{Stage: i, Worker: w, First: 3 * i, Last: 3*i + 3 + i/3,
			Compute: compute, Comm: 0.03 + 0.01*float64(i), Idle: 0.36 - compute})
	}
	s.Pipeline = p
}

func dhtNode(_ int64, s *metrics.Status) { s.DHT = &metrics.DHTStatus{Peers: 7, Records: 12} }

// demoMembers is a swarm with every role, in three regions.
func demoMembers() []member {
	return []member{
		{metrics.RoleDHT, "eu-west", dhtNode},
		{metrics.RoleServer, "eu-west", expertServer(0, 4)},
		{metrics.RoleServer, "us-east", expertServer(4, 8)},
		{metrics.RolePeer, "eu-west", trainingPeer(1)},
		{metrics.RolePeer, "us-east", trainingPeer(0.8)},
		{metrics.RolePeer, "ap-south", trainingPeer(0.6)},
		{metrics.RoleCoordinator, "ap-south", coordinator},
	}
}
