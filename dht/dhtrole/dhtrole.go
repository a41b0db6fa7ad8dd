// Package dhtrole runs a DHT node as a role of its own (`skyhive dht`),
// and the short-lived client nodes of the commands that read and write
// the swarm's DHT.
package dhtrole

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/skyhive/skyhive/dht"
	"github.com/skyhive/skyhive/jsonl"
	"github.com/skyhive/skyhive/launch"
	"github.com/skyhive/skyhive/metrics"
	"github.com/skyhive/skyhive/node"
	"github.com/skyhive/skyhive/p2p"
)

// DefaultStatsEvery is the period of the stats lines without one.
const DefaultStatsEvery = 10 * time.Second

// Config configures Run: a DHT node on a node of its own, as `skyhive dht`
// and `skyhive @FILE` run one.
type Config struct {
	// Node is the node: its host, the DHT peers it joins (none: it
	// starts a DHT), the bound on the records it stores, its status
	// record's region and period, and its metrics endpoint (node.FromLaunch).
	// Run sets the rest: a DHT server joining in the background and
	// answering dial-back checks, the status role, the log.
	Node node.Config
	// DHT is the role's options (launch.DHT): its Output and StatsEvery
	// are read here, its Net and Process only through Node.
	DHT launch.DHT
	// Stdout receives the node's addresses (or a JSON line), Stderr the
	// notices (nil: discarded).
	Stdout, Stderr io.Writer
	// Announce, if set, tells where others reach the node once its host
	// runs, e.g. by printing its addresses.
	Announce func(ctx context.Context, h *p2p.Host)
}

// Check reports the first invalid option of c that the node's own
// configuration does not cover; the error is a *launch.FieldError.
func Check(c launch.DHT) error {
	if c.Stats != "" && c.StatsEvery <= 0 {
		return &launch.FieldError{Fields: []string{"stats_every"}, Text: fmt.Sprintf("%%s must be positive, got %v", time.Duration(c.StatsEvery))}
	}
	return nil
}

// Run runs a DHT node until ctx ends: it joins the DHT peers if any (in
// the background: others may bootstrap from this node, and the periodic
// refresh retries through whoever contacts it), announces itself,
// publishes its status record and appends its routing-table size and
// stored records to the Stats file every StatsEvery.
func Run(ctx context.Context, cfg Config) error {
	c := cfg.DHT
	if cfg.Stdout == nil {
		cfg.Stdout = io.Discard
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	if err := Check(c); err != nil {
		return err
	}
	stats, closeStats, err := jsonl.Open(c.Stats)
	if err != nil {
		return &launch.FieldError{Fields: []string{"stats"}, Text: "%s", Err: err}
	}
	defer closeStats()
	ncfg := cfg.Node
	ncfg.DHT.Mode, ncfg.DHT.Optional, ncfg.ServeDialback, ncfg.Status.Role = node.DHTServer, true, true, metrics.RoleDHT
	if ncfg.Log == nil {
		ncfg.Log = cfg.Stderr
	}
	n, err := node.New(ctx, ncfg)
	if err != nil {
		return err
	}
	defer n.Close()
	if cfg.Announce != nil {
		cfg.Announce(ctx, n.Host())
	}
	d := n.DHT()
	if err := n.StartStatus(func(s *metrics.Status) {
		s.DHT = &metrics.DHTStatus{Peers: len(d.Peers()), Records: d.Records()}
	}); err != nil {
		return err
	}
	err = d.WriteStats(ctx, stats, time.Duration(c.StatsEvery))
	fmt.Fprintln(cfg.Stderr, "stopping")
	if err != nil {
		return &launch.FieldError{Fields: []string{"stats"}, Text: "%s", Err: err}
	}
	return nil
}

// WithClient starts a client-mode node on host, joins the DHT through
// seeds (required: without any the error is a *launch.FieldError about
// dht) and runs op, all within timeout; the node is closed when op
// returns. A failure to join wraps node.ErrJoin.
func WithClient(ctx context.Context, host p2p.Config, seeds []string, timeout time.Duration, op func(context.Context, *p2p.Host, *dht.Node) error) error {
	if len(seeds) == 0 {
		return &launch.FieldError{Fields: []string{"dht"}, Text: "%s is required: the multiaddr of a DHT node, ending in /p2p/PEER_ID"}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	n, err := node.New(ctx, node.Config{Host: &host, DHT: node.DHTConfig{Mode: node.DHTClient, Bootstrap: seeds, JoinTimeout: timeout}})
	if err != nil {
		return err
	}
	defer n.Close()
	return op(ctx, n.Host(), n.DHT())
}

// CheckTTL reports a record lifetime DHT nodes refuse: not positive, or
// beyond dht.DefaultMaxTTL. The error is a *launch.FieldError about ttl.
func CheckTTL(ttl time.Duration) error {
	if ttl <= 0 || ttl > dht.DefaultMaxTTL {
		return &launch.FieldError{Fields: []string{"ttl"},
			Text: fmt.Sprintf("%%s must be positive and at most %v (DHT nodes refuse records that expire later), got %v", dht.DefaultMaxTTL, ttl)}
	}
	return nil
}

// Put stores value under key (and subkey, "" for none) on the DHT peers
// nearest to it through n, expiring ttl from now (CheckTTL), and prints on
// w how many peers accepted it and when it expires.
func Put(ctx context.Context, n *dht.Node, key, subkey string, value []byte, ttl time.Duration, w io.Writer) error {
	if err := CheckTTL(ttl); err != nil {
		return err
	}
	exp := time.Now().Add(ttl)
	k, err := n.Store(ctx, key, subkey, value, exp)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "stored on %d peers, expires %s\n", k, exp.UTC().Format(time.RFC3339))
	return nil
}

// Get prints on w the freshest value under key read through n, one line
// per subkey (dht.WriteItems).
func Get(ctx context.Context, n *dht.Node, key string, w io.Writer) error {
	items, err := n.Get(ctx, key)
	if err != nil {
		return err
	}
	dht.WriteItems(w, items)
	return nil
}
