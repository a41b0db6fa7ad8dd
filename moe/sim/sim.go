// Package sim runs a decentralized mixture-of-experts swarm inside one
// process over p2p/memnet: a bootstrap DHT node, expert servers that host
// and declare the experts of one or more grids, and trainer peers whose
// traffic crosses an emulated link (a netem.Network). Experiments and benchmarks use it to
// simulate many peers on one machine with the real server, client and DHT
// code.
package sim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/moe"
	"github.com/skyhive/skyhive/moe/server"
	"github.com/skyhive/skyhive/netem"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/memnet"
)

// Config describes a simulated swarm.
type Config struct {
	// Grids are the expert grids to host (one per DMoE layer).
	Grids []moe.Grid
	// Servers is the number of expert servers; each grid's experts are
	// dealt out to them in contiguous blocks.
	Servers int
	// Server is the template of every server's configuration (Transport,
	// DHT and Experts are filled in).
	Server server.Config
	// RTT is the emulated round-trip time of every message exchange that
	// involves a trainer (half of it each way). Traffic among servers and
	// the bootstrap node (expert declarations) is not delayed.
	RTT time.Duration
	// DHT tunes every DHT node (Replicas 3, Quorum 1 unless set).
	DHT dht.Config
}

// Swarm is a running simulation.
type Swarm struct {
	Net     *memnet.Network
	Servers []*server.Server
	// Link is the emulated network the peers' messages cross.
	Link   *netem.Network
	boot   *memnet.Peer
	dhtCfg dht.Config

	mu    sync.Mutex
	nodes []*dht.Node
}

// Regions of the swarm's emulated network.
const (
	regionInfra   = "infra"
	regionTrainer = "trainer"
)

// newLink returns the swarm's link model: messages between two
// infrastructure peers (bootstrap node, servers) are instant, and messages
// to or from a trainer take half the round-trip time each way.
func newLink(rtt time.Duration) (*netem.Network, error) {
	edge := netem.LinkParams{Latency: rtt / 2}
	return netem.New(&netem.Profile{
		Regions: []string{regionInfra, regionTrainer},
		Inter:   [][]netem.LinkParams{{{}, edge}, {edge, {}}},
	}, 0)
}

// New starts the swarm and declares every expert once before returning.
func New(ctx context.Context, cfg Config) (*Swarm, error) {
	if cfg.Servers < 1 || len(cfg.Grids) == 0 {
		return nil, errors.New("sim: need at least one server and one grid")
	}
	if cfg.DHT.Replicas == 0 {
		cfg.DHT.Replicas = 3
	}
	if cfg.DHT.Quorum == 0 {
		cfg.DHT.Quorum = 1
	}
	if cfg.DHT.RefreshInterval == 0 {
		cfg.DHT.RefreshInterval = -1
	}
	if cfg.DHT.RepublishInterval == 0 {
		cfg.DHT.RepublishInterval = -1
	}
	l, err := newLink(cfg.RTT)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	s := &Swarm{Net: memnet.NewNetwork(memnet.WithLink(l), memnet.WithMaxInbound(4096)), Link: l, dhtCfg: cfg.DHT}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	boot, err := s.Net.NewPeer()
	if err != nil {
		return nil, err
	}
	s.boot = boot
	if err := l.Assign(boot.ID(), regionInfra); err != nil {
		return nil, err
	}
	if _, err := s.node(boot, false); err != nil {
		return nil, err
	}
	assign := make([][]string, cfg.Servers)
	for _, g := range cfg.Grids {
		uids := g.UIDs()
		for i := range cfg.Servers {
			assign[i] = append(assign[i], uids[i*len(uids)/cfg.Servers:(i+1)*len(uids)/cfg.Servers]...)
		}
	}
	for i, uids := range assign {
		if len(uids) == 0 {
			continue
		}
		p, err := s.Net.NewPeer()
		if err != nil {
			return nil, err
		}
		if err := l.Assign(p.ID(), regionInfra); err != nil {
			return nil, err
		}
		d, err := s.node(p, false)
		if err != nil {
			return nil, err
		}
		if err := d.Bootstrap(ctx, []peer.AddrInfo{boot.AddrInfo()}); err != nil {
			return nil, fmt.Errorf("sim: server %d bootstrap: %w", i, err)
		}
		sc := cfg.Server
		sc.Transport, sc.DHT, sc.Experts = p, d, uids
		srv, err := server.New(sc)
		if err != nil {
			return nil, err
		}
		s.Servers = append(s.Servers, srv)
	}
	// The servers' loops declare in the background; make sure a full
	// round is done before trainers start.
	var wg sync.WaitGroup
	errs := make([]error, len(s.Servers))
	for i, srv := range s.Servers {
		wg.Go(func() {
			if n, err := srv.Declare(ctx); err != nil || n > 0 {
				errs[i] = fmt.Errorf("sim: server %d declared with %d failures: %v", i, n, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

func (s *Swarm) node(p *memnet.Peer, client bool) (*dht.Node, error) {
	c := s.dhtCfg
	c.ClientMode = client
	c.PrivKey = p.PrivKey()
	d, err := dht.New(p, c)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.nodes = append(s.nodes, d)
	s.mu.Unlock()
	return d, nil
}

// NewTrainer adds a trainer peer with a client-mode DHT node that joins by
// pinging the bootstrap node (one round trip; its lookups learn the other
// peers from there). Its traffic crosses the emulated link.
func (s *Swarm) NewTrainer(ctx context.Context) (p2p.Transport, *dht.Node, error) {
	p, err := s.Net.NewPeer()
	if err != nil {
		return nil, nil, err
	}
	if err := s.Link.Assign(p.ID(), regionTrainer); err != nil {
		return nil, nil, err
	}
	d, err := s.node(p, true)
	if err != nil {
		return nil, nil, err
	}
	if err := d.Ping(ctx, s.boot.AddrInfo()); err != nil {
		return nil, nil, fmt.Errorf("sim: trainer join: %w", err)
	}
	return p, d, nil
}

// Close stops the servers, the DHT nodes and the network.
func (s *Swarm) Close() error {
	var errs []error
	for _, srv := range s.Servers {
		errs = append(errs, srv.Close())
	}
	s.mu.Lock()
	for _, d := range s.nodes {
		errs = append(errs, d.Close())
	}
	s.nodes = nil
	s.mu.Unlock()
	errs = append(errs, s.Net.Close())
	return errors.Join(errs...)
}
