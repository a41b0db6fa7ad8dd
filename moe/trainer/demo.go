package trainer

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
)

// RunDemo runs a whole DMoE swarm on loopback and trains against it: a DHT
// bootstrap node, servers expert servers hosting the grids' experts (each
// a slice of every grid), and the trainers of c, whose calls cross c's
// emulated link. It prints the result on stdout, with the calls the
// servers answered, and the progress and notices on stderr.
func RunDemo(ctx context.Context, c launch.MoETrainer, servers int, stdout, stderr io.Writer) error {
	if servers < 1 {
		return fmt.Errorf("trainer: %d expert servers: a demo needs at least 1", servers)
	}
	j, err := NewJob(c, stderr)
	if err != nil {
		return err
	}
	var nodes []*node.Node
	defer func() {
		for i := len(nodes) - 1; i >= 0; i-- {
			nodes[i].Close()
		}
	}()
	newNode := func(seeds []string) (*node.Node, error) {
		n, err := node.New(ctx, node.Config{
			Net: node.NetConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, MaxMessageBytes: 256 << 20},
			DHT: node.DHTConfig{Bootstrap: seeds},
		})
		if err == nil {
			nodes = append(nodes, n)
		}
		return n, err
	}
	boot, err := newNode(nil)
	if err != nil {
		return err
	}
	seeds := node.BootstrapAddrs([]peer.AddrInfo{boot.Host().AddrInfo()})
	fmt.Fprintf(stderr, "DHT bootstrap %s/p2p/%s\n", boot.Host().AddrInfo().Addrs[0], boot.ID())
	srvs, err := j.startServers(ctx, servers, seeds, newNode, stderr)
	for _, s := range srvs {
		defer s.Close()
	}
	if err != nil {
		return err
	}
	tn, err := newNode(seeds)
	if err != nil {
		return err
	}
	tr, err := EmulateLink(tn.Host(), j.link, c.Seed)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%d DMoE layers of %v experts (top %d), emulated one-way latency %v\n",
		len(j.grids), j.grids[0].Size, c.KBest, j.link.Latency)
	res, err := j.Train(ctx, stderr, tr, tn.DHT())
	if err != nil {
		return err
	}
	for _, s := range srvs {
		for _, e := range s.Stats().Experts {
			res.ExpertCalls += e.Forward.Requests + e.Backward.Requests
			res.ExpertBatches += e.Forward.Batches + e.Backward.Batches
		}
	}
	return j.finish(stdout, stderr, res)
}

// startServers starts n expert servers on nodes of their own joined
// through seeds, each hosting a slice of every grid, and declares their
// experts. It returns the servers it started, also on error.
func (j *Job) startServers(ctx context.Context, n int, seeds []string, newNode func([]string) (*node.Node, error), log io.Writer) ([]*server.Server, error) {
	var uids [][]string
	for _, g := range j.grids {
		uids = append(uids, g.UIDs())
	}
	var srvs []*server.Server
	for i := range n {
		nd, err := newNode(seeds)
		if err != nil {
			return srvs, err
		}
		var mine []string
		for _, us := range uids {
			mine = append(mine, us[i*len(us)/n:(i+1)*len(us)/n]...)
		}
		srv, err := server.NewContext(ctx, server.Config{Transport: nd.Host(), DHT: nd.DHT(), Experts: mine, Hidden: j.hidden, LR: j.cfg.LR,
			Seed: j.cfg.Seed, Limits: server.WireLimits(4096, j.hidden), DeclareEvery: 20 * time.Second})
		if err != nil {
			return srvs, err
		}
		srvs = append(srvs, srv)
		if _, err := srv.Declare(ctx); err != nil {
			return srvs, err
		}
		fmt.Fprintf(log, "expert server %d: %s, %d experts\n", i, p2p.ShortID(nd.ID().String()), len(mine))
	}
	return srvs, nil
}
