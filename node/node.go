// Package node is the runtime every long-running role of Skyhive runs on.
// A Node owns what each role would otherwise assemble itself: the libp2p
// host (p2p.New with the connectivity of NetConfig: listen and announce
// addresses, identity, relays, NAT traversal, the swarm's admission), its
// DHT node (server or client mode) joined through bootstrap peers, the
// Prometheus registry and the optional --metrics HTTP endpoint, the signed
// status record published every StatusConfig.Every with the role's
// numbers, the role's checkpoint directory, and the lifecycle: New starts
// them in that order (metrics, host, DHT, joining) and Close stops
// everything New and StartStatus started, in reverse order, and waits for
// their goroutines.
//
// Config is JSON-tagged data, so that a launcher can hand a child process
// its node; what only exists in-process (a host configuration holding
// parsed keys, a registerer the process serves already, callbacks, a log)
// is tagged "-".
//
// Roles on it: the averaging peer (averaging/peer.Run and RunOn, `skyhive
// peer`), the DHT node (`skyhive dht`) and its short-lived clients
// (`skyhive dht put` and `get`, `skyhive status`, `skyhive doctor`), the
// dashboard (`skyhive dashboard`), the expert server (moe/server.RunRole,
// `skyhive server`), the MoE trainer (moe/trainer.RunRole, `skyhive train
// moe`), and the pipeline worker and coordinator (pipeline.RunWorkerNode,
// `skyhive worker`; `skyhive train pipeline`). The local demos (`skyhive
// demo`) still start their coordinator's host directly.
package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/p2p"
	"github.com/skyhive/skyhive/p2p/dialback"
)

// Node is a running node. Its methods are safe for concurrent use.
type Node struct {
	cfg   Config
	log   io.Writer
	seeds []peer.AddrInfo

	// ctx is the parent of the node's goroutines; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	reg    prometheus.Registerer
	server *metrics.Server // the --metrics endpoint, if the node serves one
	host   *p2p.Host
	dht    *dht.Node

	// watchers are the node's goroutines (reach watching, an optional
	// DHT's join), waited by Close.
	watchers sync.WaitGroup

	mu         sync.Mutex
	stopStatus func() // nil until StartStatus
	closed     bool

	closeOnce sync.Once
	closeErr  error
}

// New validates cfg and starts the node: the metrics endpoint, the host,
// the DHT node, which joins through the bootstrap peers within
// DHTConfig.JoinTimeout (an optional DHT joins in the background). ctx
// bounds the start only; the node runs until Close. A failed start stops
// what it had started.
func New(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.DHT.Mode == "" {
		cfg.DHT.Mode = DHTServer
	}
	if cfg.DHT.JoinTimeout == 0 {
		cfg.DHT.JoinTimeout = DefaultJoinTimeout
	}
	n := &Node{cfg: cfg, log: cfg.Log, reg: cfg.Metrics}
	if n.log == nil {
		n.log = io.Discard
	}
	n.seeds, _ = cfg.DHT.seeds() // validated
	n.ctx, n.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := n.start(ctx); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	return n, nil
}

// start starts the node's parts in order; Close stops those it started.
func (n *Node) start(ctx context.Context) error {
	cfg := &n.cfg
	if cfg.CheckpointDir != "" {
		if err := os.MkdirAll(cfg.CheckpointDir, 0o755); err != nil {
			return fmt.Errorf("node: checkpoint directory: %w", err)
		}
	}
	if cfg.MetricsAddr != "" {
		reg := metrics.NewRegistry()
		srv, err := metrics.Serve(context.WithoutCancel(ctx), cfg.MetricsAddr, reg) // until Close, after the host
		if err != nil {
			return err
		}
		n.server, n.reg = srv, reg.Registerer()
		fmt.Fprintf(n.log, "metrics on %s\n", srv.URL())
	}
	hcfg, err := n.hostConfig()
	if err != nil {
		return err
	}
	if n.host, err = p2p.New(ctx, hcfg); err != nil {
		return err
	}
	if cfg.ServeDialback {
		dialback.Serve(n.host)
	}
	if cfg.OnReach != nil {
		n.watchers.Go(func() { _ = n.host.WatchReach(n.ctx, cfg.OnReach) })
	}
	if cfg.DHT.Mode == DHTOff {
		return nil
	}
	var tr p2p.Transport = n.host
	if cfg.DHTTransport != nil {
		if tr, err = cfg.DHTTransport(n.host); err != nil {
			return fmt.Errorf("node: DHT transport: %w", err)
		}
	}
	n.dht, err = dht.New(tr, dht.Config{
		PrivKey:    n.host.LibP2P().Peerstore().PrivKey(n.host.ID()),
		ClientMode: cfg.DHT.Mode == DHTClient,
		MaxBytes:   cfg.DHT.MaxBytes,
		Metrics:    n.reg,
	})
	if err != nil {
		return err
	}
	return n.join(ctx)
}

// hostConfig is the host's configuration: Config.Host or the one Net
// describes, reporting to the node's registerer.
func (n *Node) hostConfig() (p2p.Config, error) {
	var hcfg p2p.Config
	if n.cfg.Host != nil {
		hcfg = *n.cfg.Host
	} else {
		var err error
		if hcfg, err = n.cfg.Net.HostConfig(); err != nil {
			return hcfg, err
		}
	}
	if hcfg.Metrics == nil {
		hcfg.Metrics = n.reg
	}
	return hcfg, nil
}

// joinAdvice is what a failure to join the DHT asks to check.
const joinAdvice = "check the address, which must end in /p2p/PEER_ID, and that its peer runs and is reachable"

// join bootstraps the DHT node through the seeds, if any: within New, or
// in the background for an optional DHT, whose outcome it reports on Log.
func (n *Node) join(ctx context.Context) error {
	if len(n.seeds) == 0 {
		return nil
	}
	if n.cfg.DHT.Optional {
		n.watchers.Go(func() {
			if err := n.bootstrap(n.ctx); err != nil {
				if n.ctx.Err() == nil {
					fmt.Fprintf(n.log, "%v: %v; serving anyway, joining through whoever contacts this node\n", ErrJoin, err)
				}
				return
			}
			fmt.Fprintf(n.log, "joined the DHT: %d peers in the routing table\n", len(n.dht.Peers()))
		})
		return nil
	}
	start := time.Now()
	err := n.bootstrap(ctx)
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w: %v", cerr, err)
	}
	return fmt.Errorf("%w at %s: failed after %v (of up to %v): %w (%s)", ErrJoin, strings.Join(n.cfg.DHT.Bootstrap, ", "),
		time.Since(start).Round(time.Millisecond), n.cfg.DHT.JoinTimeout, err, joinAdvice)
}

func (n *Node) bootstrap(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.DHT.JoinTimeout)
	defer cancel()
	return n.dht.Bootstrap(ctx, n.seeds)
}

// StartStatus starts publishing the node's status record (Config.Status)
// with the role's numbers from sample (nil: none), until Close. Without a
// status period it does nothing. It fails if called twice or after Close.
func (n *Node) StartStatus(sample func(*metrics.Status)) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.closed:
		return errors.New("node: status: node closed")
	case n.stopStatus != nil:
		return errors.New("node: status: already started")
	}
	n.stopStatus = PublishStatus(n.ctx, n.log, n.host, n.dht, n.cfg.Status, sample)
	return nil
}

// Host is the node's libp2p host.
func (n *Node) Host() *p2p.Host { return n.host }

// ID is the node's peer ID.
func (n *Node) ID() peer.ID { return n.host.ID() }

// DHT is the node's DHT node (nil with the DHT off).
func (n *Node) DHT() *dht.Node { return n.dht }

// Seeds are the DHT peers the node joined through.
func (n *Node) Seeds() []peer.AddrInfo { return n.seeds }

// Metrics is the registerer the node's parts report to, for the role's
// own collectors (nil: no metrics).
func (n *Node) Metrics() prometheus.Registerer { return n.reg }

// MetricsURL is where the node serves its metrics ("" if it serves none).
func (n *Node) MetricsURL() string {
	if n.server == nil {
		return ""
	}
	return n.server.URL()
}

// CheckpointDir is the role's checkpoint directory ("" if none).
func (n *Node) CheckpointDir() string { return n.cfg.CheckpointDir }

// Config is the node's configuration, with the defaults New filled in.
func (n *Node) Config() Config { return n.cfg }

// Close stops the node in the reverse order of its start: the status
// publisher, the reach watcher, the DHT node, the host, the metrics
// endpoint; it waits for their goroutines. Later calls wait for the first
// and return its result.
func (n *Node) Close() error {
	n.closeOnce.Do(func() { n.closeErr = n.close() })
	return n.closeErr
}

func (n *Node) close() error {
	n.mu.Lock()
	n.closed = true
	stopStatus := n.stopStatus
	n.mu.Unlock()
	if stopStatus != nil {
		stopStatus()
	}
	n.cancel()
	n.watchers.Wait()
	var errs []error
	if n.dht != nil {
		errs = append(errs, n.dht.Close())
	}
	if n.host != nil {
		errs = append(errs, n.host.Close())
	}
	if n.server != nil {
		errs = append(errs, n.server.Close())
	}
	return errors.Join(errs...)
}
